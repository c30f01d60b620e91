// The client given no socketPath or url finds the daemon as the CLI does: as a normal user, the
// user's own socket ($XDG_RUNTIME_DIR/nsbox/nsboxd.sock), then the system's
// (/run/nsbox/nsboxd.sock); when neither answers, daemon_unreachable says of each why.
// The client runs as uid 65534 (setpriv), in a mount namespace of its own whose /run is a
// directory of the test, where /run/nsbox/nsboxd.sock is a hard link to a real daemon's socket
// (the host's /run untouched). Needs root, as the other suites.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, linkSync, chmodSync, writeFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { NsboxClient } from '../dist/index.js';
import { startDaemon } from './daemon.mjs';

const dist = fileURLToPath(new URL('../dist/index.js', import.meta.url));
let system, user, dir, xdg, userSocket;

before(async () => {
  [system, user] = await Promise.all([startDaemon(), startDaemon()]);
  // The system daemon has a sandbox the user's has not: which one answered is seen in the list.
  const c = new NsboxClient({ socketPath: system.socketPath });
  await c.putSandbox('on-the-system-daemon');
  c.close();
  dir = mkdtempSync(join(tmpdir(), 'nsbox-ts-sockets-'));
  chmodSync(dir, 0o755);
  xdg = join(dir, 'xdg');
  userSocket = join(xdg, 'nsbox', 'nsboxd.sock');
  mkdirSync(join(xdg, 'nsbox'), { recursive: true, mode: 0o755 });
  mkdirSync(join(dir, 'run', 'nsbox'), { recursive: true, mode: 0o755 });
  mkdirSync(join(dir, 'empty-run'), { mode: 0o755 });
  linkSync(system.socketPath, join(dir, 'run', 'nsbox', 'nsboxd.sock')); // 0660 root:root
  writeFileSync(
    join(dir, 'probe.mjs'),
    `import { NsboxClient } from ${JSON.stringify(dist)};
const c = new NsboxClient();
try {
  const ids = (await c.listSandboxes()).map((s) => s.id);
  console.log(JSON.stringify({ socket: c.socketPath, ids }));
} catch (e) {
  console.log(JSON.stringify({ code: e.code, message: e.message }));
}
c.close();
`,
  );
});
after(async () => {
  await Promise.all([system?.stop(), user?.stop()]);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** The probe as uid 65534 (in `groups`, none by default), with `run` as its /run. */
function asNobody({ run = join(dir, 'run'), groups = [], env = {} } = {}) {
  const setpriv = ['setpriv', '--reuid=65534', '--regid=65534', groups.length ? `--groups=${groups.join(',')}` : '--clear-groups'];
  const script = 'mount --bind "$1" /run && shift && exec "$@"';
  const args = ['-m', '--propagation', 'private', 'sh', '-c', script, 'sh', run, ...setpriv, '--', process.execPath, join(dir, 'probe.mjs')];
  const childEnv = { PATH: process.env.PATH, XDG_RUNTIME_DIR: xdg, ...env };
  return new Promise((resolve, reject) => {
    const child = spawn('unshare', args, { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    child.stdout.on('data', (b) => (out += b));
    child.stderr.on('data', (b) => (err += b));
    child.on('error', reject);
    child.on('exit', (code) => {
      if (code !== 0) return reject(new Error(`probe exited ${code}: ${err}${out}`));
      try {
        resolve(JSON.parse(out));
      } catch {
        reject(new Error(`probe printed no JSON: ${out}${err}`));
      }
    });
  });
}

/** A socket file nobody listens on: a server's socket, hard-linked, then the server closed. */
async function deadSocket(path) {
  const live = `${path}.live`;
  const server = createServer();
  await new Promise((resolve) => server.listen(live, resolve));
  linkSync(live, path);
  await new Promise((resolve) => server.close(resolve));
  chmodSync(path, 0o666);
}

test('no socket of the user, the system socket not the user\'s to open: each named, with its group', async () => {
  const r = await asNobody();
  assert.equal(r.code, 'daemon_unreachable', r.message);
  assert.equal(
    r.message,
    `nsbox: no nsboxd answers on the default sockets: ${userSocket}: ENOENT, no daemon there; ` +
      '/run/nsbox/nsboxd.sock: EACCES, permission denied (the socket is mode 0660, group root (id 0)): ' +
      'run as root, or join group root (sudo usermod -aG root $USER, then log in again)',
  );
});

test('a socket given that is not the user\'s to open: the group to join, named', async () => {
  const r = await asNobody({ env: { NSBOX_SOCKET: '/run/nsbox/nsboxd.sock' } });
  assert.equal(r.code, 'daemon_unreachable', r.message);
  assert.match(r.message, /^nsbox: cannot reach nsboxd at unix socket \/run\/nsbox\/nsboxd\.sock: EACCES /);
  assert.ok(
    r.message.endsWith('; permission denied (the socket is mode 0660, group root (id 0)): run as root, or join group root (sudo usermod -aG root $USER, then log in again)'),
    r.message,
  );
});

test('the control: a member of the socket\'s group reaches the system daemon after the user\'s socket', async () => {
  const r = await asNobody({ groups: [0] });
  assert.equal(r.code, undefined, r.message);
  assert.equal(r.socket, '/run/nsbox/nsboxd.sock');
  assert.deepEqual(r.ids, ['on-the-system-daemon']);
});

test('neither answers: a dead socket of the user\'s, none of the system\'s, and what to do', async () => {
  await deadSocket(userSocket);
  try {
    const r = await asNobody({ run: join(dir, 'empty-run'), groups: [0] });
    assert.equal(r.code, 'daemon_unreachable', r.message);
    assert.equal(
      r.message,
      `nsbox: no nsboxd answers on the default sockets: ${userSocket}: ECONNREFUSED, no daemon listens there; ` +
        '/run/nsbox/nsboxd.sock: ENOENT, no daemon there; start it with `sudo nsbox serve` (it listens on ' +
        '/run/nsbox/nsboxd.sock), or pass `socketPath` or `url`, or set NSBOX_SOCKET or NSBOX_URL',
    );
    // NSBOX_SOCKET is tried alone: the system's socket, which would answer, is not tried after it.
    const alone = await asNobody({ groups: [0], env: { NSBOX_SOCKET: userSocket } });
    assert.equal(alone.code, 'daemon_unreachable', alone.message);
    assert.match(alone.message, new RegExp(`^nsbox: cannot reach nsboxd at unix socket ${userSocket}: ECONNREFUSED `));
  } finally {
    rmSync(userSocket, { force: true });
  }
});

test('the user\'s own daemon answers: it is used, though the system\'s answers too', async () => {
  linkSync(user.socketPath, userSocket);
  chmodSync(user.socketPath, 0o666); // the test's own daemon, opened to the user as its own is
  try {
    const r = await asNobody({ groups: [0] });
    assert.equal(r.code, undefined, r.message);
    assert.equal(r.socket, userSocket);
    assert.deepEqual(r.ids, []);
  } finally {
    rmSync(userSocket, { force: true });
  }
});
