// Starts a real nsboxd for the tests: the binary comes from $NSBOX_BIN (default
// ../../build/runtime/nsbox relative to clients/typescript); nothing is built here.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createServer } from 'node:net';
import { randomBytes } from 'node:crypto';

const here = dirname(fileURLToPath(import.meta.url));
export const NSBOX_BIN = process.env.NSBOX_BIN
  ? resolve(process.env.NSBOX_BIN)
  : resolve(here, '..', '..', '..', 'build', 'runtime', 'nsbox');

async function freePort() {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => res(port));
    });
    srv.on('error', rej);
  });
}

/** @returns {Promise<{dir:string, socketPath:string, url?:string, token?:string, stop:()=>Promise<void>, log:()=>string}>} */
export async function startDaemon({ tcp = false } = {}) {
  if (!existsSync(NSBOX_BIN)) throw new Error(`nsbox binary not found at ${NSBOX_BIN}; build it or set NSBOX_BIN`);
  const dir = mkdtempSync(join(tmpdir(), 'nsbox-ts-'));
  const socketPath = join(dir, 's.sock');
  // A network range of its own, so that it never meets another daemon's (docs/network.md).
  const args = ['serve', '--socket', socketPath, '--state-dir', join(dir, 'state'), '--network-range', '10.216.0.0/24'];
  let url, token;
  if (tcp) {
    token = 'tok-' + randomBytes(16).toString('hex');
    writeFileSync(join(dir, 'token'), token + '\n', { mode: 0o600 });
    const port = await freePort();
    url = `http://127.0.0.1:${port}`;
    args.push('--listen', `127.0.0.1:${port}`, '--token-file', join(dir, 'token'));
  }
  const child = spawn(NSBOX_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  const exited = new Promise((r) => child.once('exit', (code, sig) => r({ code, sig })));
  const ready = await Promise.race([
    new Promise((r) => {
      const check = () => (log.includes('listening on') ? r(true) : setTimeout(check, 20).unref());
      check();
    }),
    exited.then(() => false),
    new Promise((r) => setTimeout(() => r(false), 15000).unref()),
  ]);
  if (!ready) {
    child.kill('SIGKILL');
    throw new Error(`nsboxd did not start:\n${log}`);
  }
  let stopped = false;
  return {
    dir,
    socketPath,
    url,
    token,
    log: () => log,
    async stop() {
      if (stopped) return;
      stopped = true;
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 10000);
      await exited;
      clearTimeout(t);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
