#include "policy/filesystem.h"

namespace nsbox::policy {

namespace {

constexpr PathRule kEtcAllowlist[] = {
    {"alternatives", "Debian's /usr/bin symlinks (awk, editor, pager...) point through it"},
    {"ld.so.cache", "the dynamic loader finds libraries without scanning every directory"},
    {"ld.so.conf", "ldconfig and the loader read the library path list"},
    {"ld.so.conf.d", "ld.so.conf includes it"},
    {"ssl", "TLS clients find the CA bundle at /etc/ssl/certs"},
    {"ca-certificates", "the CA bundle's sources, read by update-ca-certificates and some clients"},
    {"ca-certificates.conf", "which CAs the bundle holds"},
    {"localtime", "the host's time zone, so timestamps inside match outside"},
    {"timezone", "the name of the time zone"},
    {"bash.bashrc", "an interactive bash reads it"},
    {"profile", "login shells read it"},
    {"profile.d", "profile includes it"},
    {"inputrc", "readline key bindings"},
    {"services", "getservbyname: port names"},
    {"protocols", "getprotobyname: protocol names"},
    {"gai.conf", "getaddrinfo's address ordering"},
    {"host.conf", "resolver options"},
    {"mime.types", "file type lookups of many tools"},
    {"os-release", "which distribution the tools run on (a symlink into /usr/lib on Debian)"},
    {"debian_version", "which Debian release the tools run on"},
    {"terminfo", "terminal descriptions not in /usr/share/terminfo"},
    {"skel", "the default dotfiles some tools copy"},
    {"magic", "file(1)'s local magic"},
    {"magic.mime", "file(1)'s local magic"},
    {"xdg", "desktop tools' defaults"},
    {"perl", "Debian's perl reads its site configuration"},
    {"python3", "Debian's python reads its site configuration"},
    {"python3.11", "Debian's python reads its site configuration"},
    {"gitconfig", "git's system configuration"},
    {"vim", "vim's system configuration"},
    {"nanorc", "nano's system configuration"},
    {"dpkg", "dpkg and apt read their configuration (read-only: nothing can be installed)"},
    {"login.defs", "useradd/su defaults, nothing secret"},
    {"locale.alias", "locale names"},
    {"locale.gen", "which locales exist"},
};

constexpr PathRule kProcMaskedPaths[] = {
    {"/proc/acpi", "host firmware tables and power controls"},
    {"/proc/asound", "host sound hardware"},
    {"/proc/interrupts", "host interrupt counters: a side channel on other tenants"},
    {"/proc/kcore", "the host kernel's memory image"},
    {"/proc/keys", "the kernel keyrings, which are not namespaced"},
    {"/proc/latency_stats", "host scheduler latency: a side channel"},
    {"/proc/sched_debug", "every host task's scheduler state"},
    {"/proc/scsi", "host storage hardware and a rescan interface"},
    {"/proc/timer_list", "host timers with task names and pids"},
    {"/proc/timer_stats", "host timer usage per task"},
    {"/proc/sysrq-trigger", "SysRq: reboot or crash the host (masked, not only read-only)"},
    {"/proc/kmsg", "the host kernel log"},
};

constexpr PathRule kProcReadonlyPaths[] = {
    {"/proc/bus", "host PCI/USB configuration space"},
    {"/proc/fs", "host file system tunables"},
    {"/proc/irq", "host interrupt routing"},
    {"/proc/sys", "host-wide sysctls; the namespaced ones stay readable"},
};

constexpr PathRule kDeviceNodes[] = {
    {"null", "the empty sink every program expects"},
    {"zero", "zero bytes"},
    {"full", "a device that is always full, for ENOSPC tests"},
    {"random", "randomness"},
    {"urandom", "randomness"},
    {"tty", "the controlling terminal of the process, when it has one"},
};

}  // namespace

std::span<const PathRule> EtcAllowlist() { return kEtcAllowlist; }
std::span<const PathRule> ProcMaskedPaths() { return kProcMaskedPaths; }
std::span<const PathRule> ProcReadonlyPaths() { return kProcReadonlyPaths; }
std::span<const PathRule> DeviceNodes() { return kDeviceNodes; }

}  // namespace nsbox::policy
