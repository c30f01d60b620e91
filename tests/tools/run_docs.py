#!/usr/bin/env python3
"""Every example of the project's documents is run against a real daemon, as a new user would.

The documents: README.md, every Markdown file under docs/ (docs/api/ included) and
clients/typescript/README.md. Their fenced code blocks are taken in document order and each gets
one decision; a block with none fails the run, so that a new example is never skipped silently.

Decisions
- run: a block whose info string is console (with `$ ` lines), sh, shell or bash.
- not run: the block has, just before its fence (blank lines and other such comments between
  allowed), an HTML comment `<!-- doc: not run: REASON -->`; GitHub does not show it. The reason
  is required and is printed in the summary.
- run by clients/typescript/test.sh: a ```ts block of clients/typescript/README.md (that script
  type-checks and runs them; this runner does not).
- shown: a data block, by this rule: its info string is json, or it has no info string and no
  line that starts with `$ ` (a usage text, a table, a layout, a sample of output).
- anything else (another language, a block without an info string that has `$ ` lines, a ts
  block elsewhere) is undecided: an error.

How a block runs
- With `$ ` lines (a session): each `$ ` line is a command, a line ending in `\\` continues it
  (as in a shell) and the lines after it, up to the next `$ `, are its expected output: stdout and
  stderr together, as a terminal shows them, compared in full. A command with no line after it
  must print nothing. Its exit status is not checked (a terminal does not show it; a refusal is
  its message).
- Without `$ ` lines (a script): the block runs whole, in a subshell with `set -e`, and must
  exit 0; its output is not compared.
- Commands run in one bash per document, in its work directory (a temporary directory), in
  order: a variable set or a sandbox created by one block is there for the next. stdin is
  /dev/null.
- `<!-- doc: setup: COMMAND -->` before a block runs COMMAND first, in the same shell, unshown:
  the files a block assumes (`notes.txt`), or the sandbox a page of docs/api/ starts from. It
  must exit 0.
- `<!-- doc: skip: PREFIX -- REASON -->` before a session block: its commands that begin with
  PREFIX are not run (an interactive terminal), counted and listed with the reason.

What may differ (the comparison stays exact elsewhere)
- `...` in an expected line matches any text on that line; a line of `...` alone matches any
  number of lines (none included).
- The parts that vary from run to run match a pattern instead of their text: the VARYING
  patterns below (times, durations, exec ids, pids, usage figures, a token), and a block's own
  `<!-- doc: vary: REGEX -->` (one per comment, several comments allowed). A pattern stands for
  the document's text only where that text matches it, and the run's text there must match it
  too: the shape is still checked (an exec id stays e-<12 hex>), the rest of the line exactly.
- A value the document shows that varied (an exec id) is remembered with the value the run
  gave, and the later commands of the document use the run's value, so
  `execs/e-fe5465c6aaaa/output` after the exec that started it reads that exec's output (the
  expected output is not rewritten: the pattern matches there already).
- Trailing spaces and carriage returns at ends of lines are ignored.

The environment (main mode, as root)
- Each document runs in a private mount namespace of its own (unshare --mount --propagation
  private) with empty tmpfs mounts over /run/nsbox, /var/lib/nsbox and /etc/nsbox, so the
  documents' literal paths work and nothing of the host's is touched; a directory missing on the
  host is made for the mount point and removed after.
- PATH starts with the build's runtime/ (nsbox and nsbox-init; nsbox finds nsbox-net in
  ../net) and a directory with a `sudo` that runs its command (the runner is root already).
- A daemon is started as the documents say: `nsbox serve` on its defaults; with
  `--listen 127.0.0.1:7711 --token-file /etc/nsbox/token` too when the document uses that
  address (the token is random, written there). The first block waits until its pool of jails
  is full, as on a daemon that has run a while. It is stopped with SIGTERM at the end (and when
  the runner dies).
- After each document the host must be as before: no new nsbox cgroup, mount, process, network
  link or nftables table.

Usage:
  run_docs.py --build BUILD_DIR REPOSITORY_ROOT [DOCUMENT...]   run (as root), print a summary
  run_docs.py --list REPOSITORY_ROOT        each block's decision, without running anything
  run_docs.py --self-test                   the parser, decisions and comparison on samples
Exit code 0 when every block has a decision and every run block matches, 1 otherwise.
"""

import ctypes
import glob
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*([^\s`]*)")
ANNOTATION = re.compile(r"^\s*<!--\s*doc:\s*([a-z ]+?)\s*:\s*(.*?)\s*-->\s*$")
SHELL_LANGS = {"console", "sh", "shell", "bash"}
TS_BY_CLIENT = os.path.join("clients", "typescript", "README.md")

# What varies from one run to the next: each must match the document's text where it stands.
VARYING = [
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z",  # createdAt, startedAt, importedAt
    r"e-[0-9a-f]{12}",  # exec ids
    r'"id":"[0-9a-f]{32}"',  # an image's content id (random at each import)
    r'"durationMs":\d+',
    r'"(?:cpuUserMs|cpuSystemMs|memoryPeakBytes|pidsPeak)":\d+',
    r'"pid":\d+',
    r'"mtimeMs":[0-9.E]+',
    r"nsbox_token=[0-9a-f]{64}",
    r"Date: [A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT",
]


def documents(root):
    out = ["README.md"]
    for path in sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True)):
        out.append(os.path.relpath(path, root))
    out.append(TS_BY_CLIENT)
    return out


class Block:
    def __init__(self, doc, line, lang, lines, notes):
        self.doc, self.line, self.lang, self.lines, self.notes = doc, line, lang, lines, notes

    def note(self, kind):
        return [v for k, v in self.notes if k == kind]

    def is_session(self):
        return any(l.startswith("$ ") or l == "$" for l in self.lines)

    def decide(self):
        """(decision, reason): decision is run, not run, client, shown or undecided."""
        reasons = self.note("not run")
        if reasons:
            if not reasons[0]:
                return "undecided", "a 'not run' comment without its reason"
            return "not run", reasons[0]
        if self.lang == "ts" and self.doc == TS_BY_CLIENT:
            return "client", "run by clients/typescript/test.sh"
        if self.lang == "console" and not self.is_session():
            return "undecided", "a ```console block without `$ ` lines (output alone: use ``` )"
        if self.lang in SHELL_LANGS:
            return "run", ""
        if self.lang == "json":
            return "shown", "a JSON body"
        if self.lang == "" and not self.is_session():
            return "shown", "text without `$ ` lines"
        return "undecided", f"a ```{self.lang} block" + (" with `$ ` lines" if self.lang == "" else "")


def parse(doc, text):
    """The fenced blocks of a Markdown text, in order, each with the doc: comments before it."""
    blocks, notes, fence, body, start, lang = [], [], None, [], 0, ""
    for number, line in enumerate(text.split("\n"), 1):
        if fence is not None:
            m = FENCE.match(line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2):
                blocks.append(Block(doc, start, lang, body, notes))
                fence, notes = None, []
            else:
                body.append(line)
            continue
        m = FENCE.match(line)
        if m:
            fence, lang, body, start = m.group(1), m.group(2), [], number
            continue
        a = ANNOTATION.match(line)
        if a:
            notes.append((a.group(1), a.group(2)))
        elif line.strip() and not line.strip().startswith("<!--"):
            notes = []
    return blocks


def commands(lines):
    """[(command, expected lines)] of a session block."""
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("$ ") or line == "$"):
            i += 1
            continue
        cmd = [line[2:]]
        while cmd[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd.append(lines[i])
        i += 1
        expected = []
        while i < len(lines) and not (lines[i].startswith("$ ") or lines[i] == "$"):
            expected.append(lines[i])
            i += 1
        while expected and not expected[-1].strip():
            expected.pop()
        out.append(("\n".join(cmd), expected))
    return out


def clean(text):
    return [l.rstrip("\r ").rstrip() for l in text.split("\n")]


def line_pattern(line, varying, groups):
    """A regex for one expected line; the varying parts become groups, their text in `groups`."""
    union = re.compile("|".join(f"(?:{v})" for v in varying) + r"|\.\.\.")
    out, pos = [], 0
    for m in union.finditer(line):
        out.append(re.escape(line[pos : m.start()]))
        if m.group(0) == "...":
            out.append(r"[^\n]*?")
        else:
            which = next(v for v in varying if re.fullmatch(v, m.group(0)))
            out.append(f"(?P<g{len(groups)}>{which})")
            groups.append(m.group(0))
        pos = m.end()
    out.append(re.escape(line[pos:]))
    return "".join(out)


def compare(expected, actual, varying):
    """None when the actual output matches the expected lines, else the reason; and the
    document's varying values with the run's."""
    lines = clean(actual)
    while lines and not lines[-1]:
        lines.pop()
    text = "".join(l + "\n" for l in lines)
    groups, parts = [], []
    for line in expected:
        line = line.rstrip("\r ").rstrip()
        if line == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(line_pattern(line, varying, groups) + r"\n")
    m = re.fullmatch("".join(parts), text)
    if not m:
        return "differs", {}
    seen = {}
    for i, doc_value in enumerate(groups):
        if m.group(f"g{i}") != doc_value:
            seen[doc_value] = m.group(f"g{i}")
    return None, seen


# --- running ---------------------------------------------------------------------------------


class Shell:
    """One bash for a document; each command's stdout and stderr together, and its status."""

    def __init__(self, cwd, env):
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile"], cwd=cwd, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.nonce = secrets.token_hex(8)

    def run(self, command, timeout=120):
        marker = f"\x1fDOCEND{self.nonce}"
        script = f"{{\n{command}\n}} </dev/null 2>&1\nprintf '{marker} %d\\n' $?\n"
        self.proc.stdin.write(script.encode())
        self.proc.stdin.flush()
        data, deadline = b"", time.monotonic() + timeout
        end = re.compile(re.escape(marker.encode()) + rb" (\d+)\n")
        while True:
            m = end.search(data)
            if m:
                return data[: m.start()].decode("utf-8", "replace"), int(m.group(1))
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return data.decode("utf-8", "replace") + f"\n[no end after {timeout} s]", -1
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return data.decode("utf-8", "replace") + "\n[the shell ended]", -1
            data += chunk

    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def substitute(text, seen):
    for doc_value, value in seen.items():
        text = text.replace(doc_value, value)
    return text


def stop_with_parent():
    """In the daemon's child before exec: SIGTERM when the runner dies (a ctest timeout kills it),
    so that no daemon outlives the run (prctl(2) PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG


def pool_ready():
    metrics = subprocess.run(
        ["curl", "-sf", "--unix-socket", "/run/nsbox/nsboxd.sock", "http://x/metrics"],
        capture_output=True, text=True).stdout
    ready = re.search(r"^nsbox_pool_ready (\d+)", metrics, re.M)
    size = re.search(r"^nsbox_pool_size (\d+)", metrics, re.M)
    return not ready or not size or ready.group(1) == size.group(1)


def run_document(root, build, doc, work, report):
    """In this (already private) mount namespace: the daemon, then each block in order."""
    text = open(os.path.join(root, doc), encoding="utf-8").read()
    for point in ("/run/nsbox", "/var/lib/nsbox", "/etc/nsbox"):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "nsbox-docs", point], check=True)
    token = secrets.token_hex(32)
    with open("/etc/nsbox/token", "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(token + "\n")
    os.chmod(work, 0o755)  # as a user's directory: the jail's root (another uid) may read it
    bindir = os.path.join(work, ".bin")
    os.mkdir(bindir)
    with open(os.path.join(bindir, "sudo"), "w") as f:
        f.write('#!/bin/sh\nexec env "$@"\n')  # as sudo, NAME=VALUE first
    os.chmod(os.path.join(bindir, "sudo"), 0o755)
    env = dict(os.environ)
    env["PATH"] = f"{os.path.join(build, 'runtime')}:{bindir}:{env.get('PATH', '/usr/bin:/bin')}"
    env["HOME"] = work
    for name in ("NSBOX_URL", "NSBOX_TOKEN", "NSBOX_SOCKET"):
        env.pop(name, None)
    serve = [os.path.join(build, "runtime", "nsbox"), "serve"]
    if "127.0.0.1:7711" in text:
        serve += ["--listen", "127.0.0.1:7711", "--token-file", "/etc/nsbox/token"]
    log = open(work + ".log", "w+")
    daemon = subprocess.Popen(serve, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                              preexec_fn=stop_with_parent)
    shell = Shell(work, env)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists("/run/nsbox/nsboxd.sock") or subprocess.run(
                ["curl", "-sf", "--unix-socket", "/run/nsbox/nsboxd.sock", "http://x/v1/health"],
                stdout=subprocess.DEVNULL).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                report["failures"].append(f"{doc}: the daemon did not start:\n{log.read()}")
                return
            time.sleep(0.2)
        # A daemon that has run a while has its pool of jails ready (a creation then answers
        # "running", api/sandboxes.md): wait for it, as long as the start's deadline allows.
        while time.monotonic() < deadline and not pool_ready():
            time.sleep(0.2)
        seen = {}
        for block in parse(doc, text):
            decision, reason = block.decide()
            report["blocks"].append((block.line, decision, reason))
            if decision != "run":
                continue
            where = f"{doc}:{block.line}"
            for setup in block.note("setup"):
                out, status = shell.run(setup)
                if status != 0:
                    report["failures"].append(f"{where}: setup `{setup}` exited {status}:\n{out}")
            if not block.is_session():
                out, status = shell.run("(set -e\n" + "\n".join(block.lines) + "\n)")
                report["run"] += 1
                if status != 0:
                    report["failures"].append(f"{where}: the script exited {status}:\n{out}")
                continue
            varying = VARYING + block.note("vary")
            skips = [s.split(" -- ", 1) for s in block.note("skip")]
            for command, expected in commands(block.lines):
                skip = next((p for p in skips if command.startswith(p[0])), None)
                if skip:
                    report["skipped"].append(f"{where}: `{skip[0]}`: {skip[1]}")
                    continue
                command = substitute(command, seen)
                out, status = shell.run(command)
                report["run"] += 1
                report["compared"] += 1 if expected else 0
                why, new = compare(expected, out, varying)
                if why:
                    report["failures"].append(
                        f"{where}: `{command}` (exit {status}) printed:\n{out}\n"
                        f"--- the document shows:\n" + "\n".join(expected))
                seen.update(new)
    finally:
        shell.close()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
            report["failures"].append(f"{doc}: the daemon did not stop in 60 s at SIGTERM")
        log.seek(0)
        report["daemon_log"] = log.read()[-4000:]
        log.close()


# The daemon's cgroups are named nsbox-<8 hex of the uuid5 of its state directory>-...
# (runtime/registry_open.cc, registry_config.cc's kIdNamespace): those of the documents' daemon,
# whose state directory is /var/lib/nsbox, and not those of another test's daemon.
ID_NAMESPACE = uuid.UUID(bytes=bytes([0x6E, 0x73, 0x62, 0x6F, 0x78, 0x2D, 0x4B, 0x1E, 0x9D, 0x3A,
                                      0x51, 0x0C, 0x7E, 0x22, 0x90, 0xA4]))
CGROUP_PREFIX = "nsbox-" + uuid.uuid5(ID_NAMESPACE, "/var/lib/nsbox").hex[:8] + "-"


def host_state(build):
    """What of the documents' daemon is on the host: its cgroups, mounts of its paths, processes
    of this build's binaries, network links (nsbox-net's veths are nsb<tag>...) and nftables
    tables (nsbox_<tag>)."""
    state = set()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(": ")[1].split("@")[0] if ": " in line else ""
        if name.startswith("nsb" + CGROUP_PREFIX[6:14]):
            state.add("link " + name)
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    state |= {"nftables " + t for t in tables.splitlines() if "nsbox_" + CGROUP_PREFIX[6:14] in t}
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory",
                 "/sys/fs/cgroup/pids", "/sys/fs/cgroup/cpu"):
        for depth in ("*", "*/*"):
            for path in glob.glob(os.path.join(base, depth)):
                if os.path.basename(path).startswith(CGROUP_PREFIX) and os.path.isdir(path):
                    state.add("cgroup " + path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split(" ")[4]
            if point.startswith(("/run/nsbox", "/var/lib/nsbox", "/etc/nsbox")):
                state.add("mount " + point)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            if exe.startswith(build + "/") and re.search(r"/nsbox(-init|-net)?( \(deleted\))?$", exe):
                state.add(f"process {pid} {exe}")
    return state


def main_run(root, build, docs):
    made = []
    for point in ("/run/nsbox", "/var/lib/nsbox", "/etc/nsbox"):
        if not os.path.exists(point):
            os.makedirs(point)
            made.append(point)
    failures, totals = [], {}
    try:
        for doc in docs:
            blocks = parse(doc, open(os.path.join(root, doc), encoding="utf-8").read())
            if all(b.decide()[0] != "run" for b in blocks):  # no daemon for nothing to run
                counts, lines = {}, []
                for b in blocks:
                    d, r = b.decide()
                    counts[d] = counts.get(d, 0) + 1
                    if d == "undecided":
                        failures.append(f"{doc}:{b.line}: no decision: {r}")
                    elif d == "not run":
                        lines.append(f"    line {b.line}: {r}")
                print(f"{doc}: {len(blocks)} blocks: "
                      + ", ".join(f"{n} {d}" for d, n in sorted(counts.items())))
                print("\n".join(lines)) if lines else None
                continue
            before = host_state(build)
            started = time.monotonic()
            out = tempfile.NamedTemporaryFile(prefix="nsbox-docs-", suffix=".json", delete=False)
            out.close()
            work = tempfile.mkdtemp(prefix="nsbox-docs-")  # the document's current directory
            child = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", sys.executable,
                 os.path.abspath(__file__), "--one", doc, "--build", build, "--out", out.name,
                 "--work", work, root])
            # Removed here, so that a runner killed in the namespace leaves no directory either.
            shutil.rmtree(work, ignore_errors=True)
            if os.path.exists(work + ".log"):
                os.unlink(work + ".log")
            try:
                report = json.load(open(out.name))
            except ValueError:
                report = {"blocks": [], "run": 0, "compared": 0, "skipped": [],
                          "failures": [f"{doc}: the runner exited {child.returncode}"]}
            os.unlink(out.name)
            time.sleep(0.5)
            left = host_state(build) - before
            if left:
                report["failures"].append(f"{doc}: left on the host: " + ", ".join(sorted(left)))
            if report["failures"] and report.get("daemon_log"):
                report["failures"].append(f"{doc}: the daemon's log ends:\n{report['daemon_log']}")
            failures += report["failures"]
            counts = {}
            for _, decision, reason in report["blocks"]:
                counts[decision] = counts.get(decision, 0) + 1
            totals[doc] = counts
            not_run = [f"    line {l}: {r}" for l, d, r in report["blocks"] if d == "not run"]
            print(f"{doc}: {len(report['blocks'])} blocks: "
                  + ", ".join(f"{n} {d}" for d, n in sorted(counts.items()))
                  + f"; {report['run']} commands run, {report['compared']} compared"
                  + f" ({time.monotonic() - started:.1f} s)")
            for line in not_run + [f"    skipped {s}" for s in report["skipped"]]:
                print(line)
            for l, d, r in report["blocks"]:
                if d == "undecided":
                    failures.append(f"{doc}:{l}: no decision: {r}")
    finally:
        for point in made:
            os.rmdir(point)
    for failure in failures:
        print("FAIL " + failure, file=sys.stderr)
    return 1 if failures else 0


def main_list(root):
    bad = 0
    for doc in documents(root):
        for block in parse(doc, open(os.path.join(root, doc), encoding="utf-8").read()):
            decision, reason = block.decide()
            bad += decision == "undecided"
            print(f"{doc}:{block.line}: {decision}" + (f": {reason}" if reason else ""))
    return 1 if bad else 0


# --- self-test -------------------------------------------------------------------------------


def self_test():
    sample = "\n".join([
        "```console", "$ echo hi", "hi", "```",
        "<!-- doc: not run: needs the internet -->", "", "```sh", "curl example.com", "```",
        "```json", "{}", "```",
        "```", "usage text", "```",
        "```", "$ nsbox ls", "```",
        "```python", "print(1)", "```",
        "<!-- doc: not run: -->", "```sh", "true", "```",
        "<!-- doc: not run: stale -->", "some prose", "```sh", "x", "```",
        "````console", "$ a \\", "  b", "```", "out", "````",
        "```console", "output alone", "```",
    ])
    got = [b.decide()[0] for b in parse("docs/x.md", sample)]
    want = ["run", "not run", "shown", "shown", "undecided", "undecided", "undecided", "run",
            "run", "undecided"]
    failures = []
    if got != want:
        failures.append(f"decisions {got}, want {want}")
    last = parse("docs/x.md", sample)[-2]
    if commands(last.lines) != [("a \\\n  b", ["```", "out"])]:
        failures.append(f"continuation: {commands(last.lines)}")
    ts = parse(TS_BY_CLIENT, "```ts\nx\n```\n")[0].decide()[0]
    if ts != "client" or parse("README.md", "```ts\nx\n```\n")[0].decide()[0] != "undecided":
        failures.append("a ts block is the client's in its README only")
    cases = [
        (["hi"], "hi\n", True), (["hi"], "hi", True), (["hi"], "ho\n", False),
        ([], "", True), ([], "noise\n", False), (["a"], "a\nb\n", False),
        (["a", "...", "c"], "a\nb\nb2\nc\n", True), (["a", "...", "c"], "a\nc\n", True),
        (["a", "...", "c"], "a\nb\n", False), (['{"id":"x",...}'], '{"id":"x","n":1}\n', True),
        (['{"id":"x",...}'], '{"id":"y","n":1}\n', False),
        (['{"durationMs":16}'], '{"durationMs":203}\n', True),
        (['{"durationMs":16}'], '{"durationMs":"x"}\n', False),
        (["HTTP/1.1 200 OK"], "HTTP/1.1 200 OK\r\n", True),
        (["pid 12 ok"], "pid 13 ok\n", False),
    ]
    for expected, actual, match in cases:
        why, _ = compare(expected, actual, VARYING)
        if (why is None) != match:
            failures.append(f"compare {expected} with {actual!r}: want {'a match' if match else 'a difference'}")
    if compare(["pid 12 ok"], "pid 13 ok\n", VARYING + [r"pid \d+"])[0] is not None:
        failures.append("a block's own vary pattern is not used")
    _, seen = compare(['{"execId":"e-fe5465c6aaaa"}'], '{"execId":"e-0123456789ab"}\n', VARYING)
    if seen != {"e-fe5465c6aaaa": "e-0123456789ab"}:
        failures.append(f"a varying value is not carried: {seen}")
    if substitute("execs/e-fe5465c6aaaa/output", seen) != "execs/e-0123456789ab/output":
        failures.append("substitution")
    with tempfile.TemporaryDirectory() as d:
        shell = Shell(d, dict(os.environ))
        try:
            if shell.run("X=1; echo out; echo err >&2") != ("out\nerr\n", 0):
                failures.append("the shell's output")
            if shell.run("printf no-newline; (exit 3)") != ("no-newline", 3):
                failures.append("a status or an output without a newline")
            if shell.run("echo $X; cat") != ("1\n", 0):
                failures.append("the shell keeps variables; stdin is empty")
        finally:
            shell.close()
    for f in failures:
        print("FAIL " + f, file=sys.stderr)
    print(f"run_docs.py self-test: {len(failures)} failures")
    return 1 if failures else 0


def main(argv):
    if argv[:1] == ["--self-test"]:
        return self_test()
    if argv[:1] == ["--list"]:
        return main_list(os.path.abspath(argv[1]))
    if argv[:1] == ["--one"]:
        doc, build, out, work, root = argv[1], argv[3], argv[5], argv[7], argv[8]
        report = {"blocks": [], "run": 0, "compared": 0, "skipped": [], "failures": []}
        try:
            run_document(root, build, doc, work, report)
        finally:
            json.dump(report, open(out, "w"))
        return 0
    if argv[:1] != ["--build"] or len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(argv[2])
    if os.geteuid() != 0:
        print("run_docs.py: the examples run as root (a daemon, jails): run as root", file=sys.stderr)
        return 1
    return main_run(root, os.path.abspath(argv[1]), argv[3:] or documents(root))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
