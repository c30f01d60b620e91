// Where the daemon is when the caller does not say: the CLI's rule (runtime/cli/client.cc,
// Endpoint), and the message that says of each socket tried why it did not answer.
import { connect } from 'node:net';
import { statSync, readFileSync } from 'node:fs';

/** The system daemon's socket (`sudo nsbox serve`). */
export const SYSTEM_SOCKET = '/run/nsbox/nsboxd.sock';

/**
 * The sockets a client given no `socketPath` or `url` tries, in order: `$NSBOX_SOCKET` alone when
 * it is set; else, as root, `/run/nsbox/nsboxd.sock`; else the user's own daemon's socket
 * (`$XDG_RUNTIME_DIR/nsbox/nsboxd.sock`, or `/tmp/nsbox-<uid>/nsbox/nsboxd.sock` without
 * `XDG_RUNTIME_DIR`) and then the system's, as the `nsbox` CLI does.
 */
export function defaultSocketPaths(): string[] {
  if (process.env.NSBOX_SOCKET) return [process.env.NSBOX_SOCKET];
  const uid = typeof process.getuid === 'function' ? process.getuid() : 0;
  if (uid === 0) return [SYSTEM_SOCKET];
  const runtimeDir = process.env.XDG_RUNTIME_DIR || `/tmp/nsbox-${uid}`;
  return [`${runtimeDir}/nsbox/nsboxd.sock`, SYSTEM_SOCKET];
}

/** The first socket of {@link defaultSocketPaths}: the one tried first. */
export function defaultSocketPath(): string {
  return defaultSocketPaths()[0]!;
}

/** One socket tried, and the errno name of its failure. */
export interface SocketFailure {
  socket: string;
  code: string;
}

/** Connects to each socket in turn and hangs up: the first that accepts, or why each did not. */
export async function firstAnswering(sockets: readonly string[]): Promise<{ socket?: string; failures: SocketFailure[] }> {
  const failures: SocketFailure[] = [];
  for (const socket of sockets) {
    const code = await new Promise<string | undefined>((resolve) => {
      const s = connect({ path: socket });
      s.once('connect', () => {
        s.destroy();
        resolve(undefined);
      });
      s.once('error', (err: NodeJS.ErrnoException) => {
        s.destroy();
        resolve(err.code ?? 'EIO');
      });
    });
    if (code === undefined) return { socket, failures };
    failures.push({ socket, code });
  }
  return { failures };
}

/** The name of group `gid` from /etc/group, or undefined. */
function groupName(gid: number): string | undefined {
  try {
    for (const line of readFileSync('/etc/group', 'utf8').split('\n')) {
      const [name, , id] = line.split(':');
      if (name && id !== undefined && Number(id) === gid && /^\d+$/.test(id)) return name;
    }
  } catch {
    /* no /etc/group: the id alone */
  }
  return undefined;
}

/** What a user who may not open the socket does about it: the socket's group, named. */
export function accessHint(socket: string): string {
  let st;
  try {
    st = statSync(socket);
  } catch {
    return 'permission denied: run as root or as a member of the socket\'s group';
  }
  const mode = (st.mode & 0o7777).toString(8).padStart(4, '0');
  const name = groupName(st.gid);
  const join = name ?? String(st.gid);
  return (
    `permission denied (the socket is mode ${mode}, ${name ? `group ${name} (id ${st.gid})` : `group id ${st.gid}`}): ` +
    `run as root, or join group ${join} (sudo usermod -aG ${join} $USER, then log in again)`
  );
}

/** One socket tried, and why it did not answer. */
function tried(f: SocketFailure): string {
  if (f.code === 'ENOENT') return `${f.socket}: ENOENT, no daemon there`;
  if (f.code === 'ECONNREFUSED') return `${f.socket}: ECONNREFUSED, no daemon listens there`;
  if (f.code === 'EACCES' || f.code === 'EPERM') return `${f.socket}: ${f.code}, ${accessHint(f.socket)}`;
  return `${f.socket}: ${f.code}`;
}

/** The message of a client that found no daemon on any of the default sockets. */
export function noDaemonMessage(failures: readonly SocketFailure[]): string {
  let text = `nsbox: no nsboxd answers on the default sockets: ${failures.map(tried).join('; ')}`;
  if (!failures.some((f) => f.code === 'EACCES' || f.code === 'EPERM')) {
    text += `; start it with \`sudo nsbox serve\` (it listens on ${SYSTEM_SOCKET}), or pass \`socketPath\` or \`url\`, or set NSBOX_SOCKET or NSBOX_URL`;
  }
  return text;
}
