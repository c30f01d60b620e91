// NsboxClient against a real nsboxd (Node 20 is enough).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { NsboxClient, NsboxError, defaultSocketPath } from '../dist/index.js';
import { startDaemon } from './daemon.mjs';

let d, c;
const ID = 'conv/42 ü';

before(async () => {
  d = await startDaemon({ tcp: true });
  c = new NsboxClient({ socketPath: d.socketPath });
});
after(async () => {
  c?.close();
  await d?.stop();
});

async function rejects(promise, code) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof Error, 'an Error');
    assert.equal(e.code, code, `code of ${e.message}`);
    return e;
  }
  assert.fail(`expected a rejection with ${code}`);
}

test('health', async () => {
  const h = await c.health();
  assert.equal(h.ok, true);
  assert.equal(typeof h.version, 'string');
});

test('putSandbox: find-or-create, 201 then 200, id percent-encoded', async () => {
  const a = await c.putSandbox(ID, { env: { GREETING: 'hello' } });
  assert.equal(a.created, true);
  assert.equal(a.id, ID);
  assert.equal(a.cwd, '/workspace');
  const b = await c.putSandbox(ID);
  assert.equal(b.created, false);
  assert.equal(b.createdAt, a.createdAt);
});

test('putSandbox concurrently: exactly one created', async () => {
  const rs = await Promise.all([1, 2, 3, 4].map(() => c.putSandbox('race')));
  assert.equal(rs.filter((r) => r.created).length, 1);
  await c.deleteSandbox('race');
});

test('getSandbox / listSandboxes', async () => {
  const s = await c.getSandbox(ID);
  assert.equal(s.id, ID);
  const list = await c.listSandboxes();
  assert.ok(list.some((x) => x.id === ID));
  await rejects(c.getSandbox('nope'), 'sandbox_not_found');
});

test('exec buffered: stdout, stderr, exit code, cwd, env, stdin', async () => {
  const r = await c.exec(ID, 'echo $GREETING; echo err >&2; pwd; exit 3');
  assert.equal(r.stdout, 'hello\n/workspace\n');
  assert.equal(r.stderr, 'err\n');
  assert.equal(r.exitCode, 3);
  assert.equal(r.reason, 'exited');
  await c.mkdir(ID, 'sub/dir', { recursive: true });
  const r2 = await c.exec(ID, 'pwd; echo "$A-${GREETING:-unset}"', { cwd: 'sub/dir', env: { A: 'x', GREETING: null } });
  assert.equal(r2.stdout, '/workspace/sub/dir\nx-unset\n');
  const r3 = await c.exec(ID, 'cat | tr a-z A-Z', { stdin: 'piped' });
  assert.equal(r3.stdout, 'PIPED');
  const r4 = await c.exec(ID, 'printf "\\377ok"', { encoding: 'base64' });
  assert.equal(Buffer.from(r4.stdoutBase64, 'base64').toString('latin1'), '\xffok');
});

test('exec usage: six figures, each a number or null, in the answer and the exit event', async () => {
  const keys = ['cpuUserMs', 'cpuSystemMs', 'memoryPeakBytes', 'pidsPeak', 'ioReadBytes', 'ioWriteBytes'];
  const check = (usage) => {
    assert.deepEqual(Object.keys(usage).sort(), [...keys].sort());
    for (const k of keys) assert.ok(usage[k] === null || (Number.isInteger(usage[k]) && usage[k] >= 0), `${k}: ${usage[k]}`);
  };
  const r = await c.exec(ID, 'i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done');
  check(r.usage);
  // cpu.stat is in every cgroup v2 directory: a busy loop has used some CPU.
  assert.ok(r.usage.cpuUserMs + r.usage.cpuSystemMs > 0, JSON.stringify(r.usage));
  const events = [];
  for await (const ev of c.execStream(ID, 'true')) events.push(ev);
  check(events.at(-1).usage);
});

test('exec timeout: 124, timedOut', async () => {
  const t0 = Date.now();
  const r = await c.exec(ID, 'sleep 10', { timeoutMs: 300 });
  assert.equal(r.exitCode, 124);
  assert.equal(r.timedOut, true);
  assert.equal(r.reason, 'timeout');
  assert.match(r.stderr, /timed out after 300 ms/);
  assert.ok(Date.now() - t0 < 5000);
});

test('exec abort: AbortError, and the command is killed in the sandbox', async () => {
  const ac = new AbortController();
  const p = c.exec(ID, 'echo $$ > /tmp/abort.pid; sleep 30; touch /workspace/survived', { signal: ac.signal });
  await new Promise((r) => setTimeout(r, 500));
  ac.abort();
  const e = await p.then(() => null, (err) => err);
  assert.ok(e, 'rejected');
  assert.equal(e.name, 'AbortError');
  await new Promise((r) => setTimeout(r, 300));
  const check = await c.exec(ID, 'kill -0 $(cat /tmp/abort.pid) 2>/dev/null && echo alive || echo gone; pgrep -x sleep || true');
  assert.equal(check.stdout, 'gone\n');
  // an already-aborted signal never sends the request
  await assert.rejects(c.exec(ID, 'true', { signal: AbortSignal.abort() }), { name: 'AbortError' });
});

test('execStream: start, output events, exit', async () => {
  const events = [];
  for await (const ev of c.execStream(ID, 'echo one; echo two >&2; exit 5')) events.push(ev);
  assert.equal(events[0].type, 'start');
  assert.match(events[0].execId, /.+/);
  const out = events.filter((e) => e.type === 'stdout').map((e) => e.data).join('');
  const err = events.filter((e) => e.type === 'stderr').map((e) => e.data).join('');
  assert.equal(out, 'one\n');
  assert.equal(err, 'two\n');
  const exit = events.at(-1);
  assert.equal(exit.type, 'exit');
  assert.equal(exit.exitCode, 5);
});

test('execStream: events arrive as they come; break kills the command', async () => {
  const t0 = Date.now();
  for await (const ev of c.execStream(ID, 'echo $$ > /tmp/brk.pid; echo first; sleep 30')) {
    if (ev.type === 'stdout') break;
  }
  assert.ok(Date.now() - t0 < 5000, 'first event before the command ends');
  await new Promise((r) => setTimeout(r, 300));
  const check = await c.exec(ID, 'kill -0 $(cat /tmp/brk.pid) 2>/dev/null && echo alive || echo gone');
  assert.equal(check.stdout, 'gone\n');
});

test('listExecs and cancelExec: the stream ends cancelled', async () => {
  const it = c.execStream(ID, 'sleep 30');
  const first = await it.next();
  assert.equal(first.value.type, 'start');
  const running = await c.listExecs(ID);
  assert.ok(Array.isArray(running));
  assert.ok(running.some((x) => x.execId === first.value.execId), JSON.stringify(running));
  await c.cancelExec(ID, first.value.execId);
  let last;
  for await (const ev of it) last = ev;
  assert.equal(last.type, 'exit');
  assert.equal(last.cancelled, true);
  assert.equal(last.reason, 'cancelled');
});

test('detach and attachOutput: re-attach by offset after the starter left', async () => {
  let execId;
  let next = 0;
  let out = '';
  for await (const ev of c.execStream(ID, 'for i in 1 2 3 4 5; do echo line$i; sleep 0.2; done', { detach: true })) {
    if (ev.type === 'start') execId = ev.execId;
    if (ev.type === 'stdout') {
      assert.equal(ev.offset, next);
      out += ev.data;
      next += Buffer.byteLength(ev.data);
      break; // hangs up: detached, so the command goes on
    }
  }
  const running = await c.listExecs(ID);
  assert.ok(running.some((x) => x.execId === execId), JSON.stringify(running));
  let exit;
  for await (const ev of c.attachOutput(ID, execId, { offset: next, follow: true })) {
    if (ev.type === 'stdout') {
      assert.equal(ev.offset, next);
      out += ev.data;
      next += Buffer.byteLength(ev.data);
    }
    if (ev.type === 'exit') exit = ev;
  }
  assert.equal(out, 'line1\nline2\nline3\nline4\nline5\n');
  assert.equal(exit.exitCode, 0);
  const all = await c.listExecs(ID, { all: true });
  assert.equal(all.find((x) => x.execId === execId)?.state, 'exited');
  await rejects(c.attachOutput(ID, execId, { offset: 9999 }).next(), 'invalid_request');
  await rejects(c.attachOutput(ID, 'e-000000000000').next(), 'exec_not_found');
});

test('sendStdin: a streamed stdin in pieces, then closed', async () => {
  const it = c.execStream(ID, 'cat', { stdinStream: true });
  const first = await it.next();
  assert.equal(first.value.type, 'start');
  const execId = first.value.execId;
  await c.sendStdin(ID, execId, 'one ');
  await c.sendStdin(ID, execId, Buffer.from('two '));
  await c.sendStdin(ID, execId, 'three', { close: true });
  let out = '';
  let exit;
  for await (const ev of it) {
    if (ev.type === 'stdout') out += ev.data;
    if (ev.type === 'exit') exit = ev;
  }
  assert.equal(out, 'one two three');
  assert.equal(exit.exitCode, 0);
  await rejects(c.sendStdin(ID, execId, 'late'), 'exec_ended');
});

test('execStream abort signal: AbortError', async () => {
  const ac = new AbortController();
  setTimeout(() => ac.abort(), 300);
  await assert.rejects(
    (async () => {
      for await (const _ of c.execStream(ID, 'sleep 30', { signal: ac.signal }));
    })(),
    { name: 'AbortError' },
  );
});

test('files: bytes round trip, nested parents, unicode, binary', async () => {
  const bin = Buffer.from([0, 1, 2, 255, 254, 10, 13]);
  await c.writeFile(ID, 'a/b/c/bin.dat', bin);
  assert.deepEqual(await c.readFile(ID, '/workspace/a/b/c/bin.dat'), bin);
  await c.writeFile(ID, 'dir/héllo wörld ✓.txt', 'texte ✓\n');
  assert.equal((await c.readFile(ID, 'dir/héllo wörld ✓.txt')).toString(), 'texte ✓\n');
  assert.deepEqual(await c.readdir(ID, 'dir'), ['héllo wörld ✓.txt']);
  await c.writeFile(ID, 'empty', '');
  assert.equal((await c.readFile(ID, 'empty')).length, 0);
});

test('files as streams', async () => {
  const big = Buffer.alloc(3 * 1024 * 1024 + 7, 'x');
  await c.writeFile(ID, 'big.bin', Readable.from([big.subarray(0, 1000), big.subarray(1000)]));
  async function* gen() { yield Buffer.from('ab'); yield Buffer.from('cd'); }
  await c.writeFile(ID, 'gen.txt', gen());
  assert.equal((await c.readFile(ID, 'gen.txt')).toString(), 'abcd');
  const stream = await c.readFileStream(ID, 'big.bin');
  let n = 0;
  for await (const chunk of stream) n += chunk.length;
  assert.equal(n, big.length);
  await rejects(c.readFileStream(ID, 'missing.bin'), 'ENOENT');
});

test('file errors: ENOENT, EISDIR, message and path from the API', async () => {
  const e = await rejects(c.readFile(ID, 'nope.txt'), 'ENOENT');
  assert.match(e.message, /no such file or directory/);
  assert.equal(e.path, '/workspace/nope.txt');
  assert.equal(e.status, 404);
  assert.ok(e instanceof NsboxError);
  await rejects(c.readFile(ID, 'dir'), 'EISDIR');
  await rejects(c.writeFile(ID, 'dir', 'x'), 'EISDIR');
});

test('stat: file, directory, symlink, dangling symlink', async () => {
  await c.writeFile(ID, 's/f.txt', 'hello');
  await c.exec(ID, 'cd s && ln -s f.txt link && ln -s nowhere dangling && ln -s . dirlink');
  const f = await c.stat(ID, 's/f.txt');
  assert.deepEqual({ ...f, mtimeMs: 0 }, { isFile: true, isDirectory: false, isSymbolicLink: false, size: 5, mtimeMs: 0, mode: 0o100644 });
  assert.ok(Math.abs(f.mtimeMs - Date.now()) < 60000);
  await c.writeFile(ID, 'm/run.sh', '#!/bin/sh\necho ran\n', { mode: 0o755 });
  assert.equal((await c.stat(ID, 'm/run.sh')).mode, 0o100755);
  assert.equal((await c.exec(ID, './m/run.sh')).stdout, 'ran\n');
  await assert.rejects(c.writeFile(ID, 'm/x', 'x', { mode: 0o10000 }), TypeError);
  const l = await c.stat(ID, 's/link');
  assert.equal(l.isFile, true);
  assert.equal(l.isSymbolicLink, true);
  assert.equal(l.size, 5);
  const dl = await c.stat(ID, 's/dirlink');
  assert.equal(dl.isDirectory, true);
  assert.equal(dl.isSymbolicLink, true);
  const dir = await c.stat(ID, 's');
  assert.equal(dir.isDirectory, true);
  await rejects(c.stat(ID, 's/dangling'), 'ENOENT');
  await rejects(c.stat(ID, 's/missing'), 'ENOENT');
});

test('readdir: names sorted, withTypes, ENOTDIR', async () => {
  assert.deepEqual(await c.readdir(ID, 's'), ['dangling', 'dirlink', 'f.txt', 'link']);
  const typed = await c.readdir(ID, 's', { withTypes: true });
  assert.deepEqual(typed.map((e) => [e.name, e.type]), [
    ['dangling', 'symlink'], ['dirlink', 'symlink'], ['f.txt', 'file'], ['link', 'symlink'],
  ]);
  await rejects(c.readdir(ID, 's/f.txt'), 'ENOTDIR');
  await rejects(c.readdir(ID, 'nothere'), 'ENOENT');
});

test('non-UTF-8 names: nameBase64 and Buffer paths', async () => {
  await c.exec(ID, "mkdir -p raw && printf x > raw/$(printf 'a\\377b')");
  const typed = await c.readdir(ID, 'raw', { withTypes: true });
  assert.equal(typed.length, 1);
  assert.ok(typed[0].nameBase64, JSON.stringify(typed));
  const bytes = Buffer.concat([Buffer.from('/workspace/raw/'), Buffer.from(typed[0].nameBase64, 'base64')]);
  assert.equal((await c.stat(ID, bytes)).size, 1);
  assert.equal((await c.readFile(ID, bytes)).toString(), 'x');
  await c.rm(ID, bytes);
  assert.deepEqual(await c.readdir(ID, 'raw'), []);
});

test('exists: true, false, dangling symlink false, NUL byte false', async () => {
  assert.equal(await c.exists(ID, 's/f.txt'), true);
  assert.equal(await c.exists(ID, 's'), true);
  assert.equal(await c.exists(ID, 's/link'), true);
  assert.equal(await c.exists(ID, 's/dangling'), false);
  assert.equal(await c.exists(ID, 'nothing/here'), false);
  assert.equal(await c.exists(ID, 'bad\0path'), false);
});

test('mkdir: Node semantics', async () => {
  await c.mkdir(ID, 'm1');
  await rejects(c.mkdir(ID, 'm1'), 'EEXIST');
  await rejects(c.mkdir(ID, 'm2/x'), 'ENOENT');
  await c.mkdir(ID, 'm2/x/y', { recursive: true });
  await c.mkdir(ID, 'm2/x/y', { recursive: true });
  await rejects(c.mkdir(ID, 's/f.txt', { recursive: true }), 'EEXIST');
  await rejects(c.mkdir(ID, 's/f.txt/sub', { recursive: true }), 'ENOTDIR');
  assert.equal((await c.stat(ID, 'm2/x/y')).isDirectory, true);
});

test('rm: Node semantics, ERR_FS_EISDIR', async () => {
  await c.writeFile(ID, 'r/a/b.txt', 'b');
  const e = await rejects(c.rm(ID, 'r'), 'ERR_FS_EISDIR');
  assert.match(e.message, /is a directory/);
  await rejects(c.rm(ID, 'r/none'), 'ENOENT');
  await c.rm(ID, 'r/none', { force: true });
  await c.rm(ID, 'r/a/b.txt');
  await c.rm(ID, 'r', { recursive: true });
  assert.equal(await c.exists(ID, 'r'), false);
});

test('stopSandbox keeps files; the next call starts it again', async () => {
  await c.writeFile(ID, 'keep.txt', 'kept');
  const s = await c.stopSandbox(ID);
  assert.equal(s.state, 'stopped');
  assert.equal((await c.readFile(ID, 'keep.txt')).toString(), 'kept');
  assert.equal((await c.getSandbox(ID)).state, 'running');
});

test('network: policy at creation, replaced while running, bad entries named', async () => {
  const id = 'net-ts';
  const created = await c.putSandbox(id, { network: { allow: ['Allowed.Example', '10.20.0.0/16:5432'] } });
  assert.deepEqual(created.network, { allow: ['allowed.example', '10.20.0.0/16:5432'] });
  assert.equal(created.address, null, 'no address before it runs');
  const r = await c.exec(id, 'cat /etc/resolv.conf; ip -o -4 addr show dev eth0 2>&1 || true');
  assert.match(r.stdout, /nameserver \d+\.\d+\.\d+\.\d+/);
  const running = await c.getNetwork(id);
  assert.match(running.address ?? '', /^\d+\.\d+\.\d+\.\d+$/);
  const none = await c.setNetwork(id, 'none');
  assert.equal(none.network, 'none');
  assert.equal(none.address, null);
  const gone = await c.exec(id, 'ip -o link show dev eth0 >/dev/null 2>&1 && echo has-eth0 || echo no-eth0');
  assert.equal(gone.stdout.trim(), 'no-eth0');
  const e = await rejects(c.setNetwork(id, { allow: ['ok.example', 'foo..com'] }), 'invalid_request');
  assert.match(e.message, /foo\.\.com/);
  await rejects(c.setNetwork('no-such-sandbox', 'open'), 'sandbox_not_found');
  // An allow list with nothing in it would reach nothing: refused, naming "none".
  const empty = await rejects(c.setNetwork(id, { allow: [] }), 'invalid_request');
  assert.match(empty.message, /empty allow list.*"none"/);
  await c.deleteSandbox(id);
});

test('metrics: Prometheus text', async () => {
  const m = await c.metrics();
  assert.match(m, /^# (HELP|TYPE) /m);
});

test('TCP with a token; a wrong token is the 401 message', async () => {
  const t = new NsboxClient({ url: d.url, token: d.token });
  assert.equal((await t.health()).ok, true);
  assert.ok((await t.listSandboxes()).some((x) => x.id === ID));
  t.close();
  const bad = new NsboxClient({ url: d.url, token: 'wrong' });
  const e = await rejects(bad.listSandboxes(), 'unauthorized');
  assert.equal(e.status, 401);
  assert.ok(e.message.length > 0);
  bad.close();
});

test('daemon not running: error names the socket', async () => {
  const dead = new NsboxClient({ socketPath: '/tmp/no-such-dir/nsboxd.sock' });
  const e = await rejects(dead.health(), 'daemon_unreachable');
  assert.match(e.message, /\/tmp\/no-such-dir\/nsboxd\.sock/);
});

test('invalid options: TypeError naming the option', () => {
  assert.throws(() => new NsboxClient({ socketPath: 3 }), (e) => e instanceof TypeError && /socketPath/.test(e.message));
  assert.throws(() => new NsboxClient({ url: 'not a url' }), (e) => e instanceof TypeError && /url/.test(e.message));
  assert.throws(() => new NsboxClient({ url: 'ftp://x' }), (e) => e instanceof TypeError && /url/.test(e.message));
  assert.throws(() => new NsboxClient({ socketPath: '/a', url: 'http://x' }), TypeError);
  assert.throws(() => new NsboxClient({ socketPath: '/a', token: 't' }), (e) => e instanceof TypeError && /token/.test(e.message));
  assert.throws(() => new NsboxClient({ socket: '/a' }), (e) => e instanceof TypeError && /unknown option `socket`/.test(e.message));
  assert.throws(() => new NsboxClient({ url: 'http://u:pw@127.0.0.1:1' }), (e) => e instanceof TypeError && /credentials/.test(e.message));
  assert.throws(() => new NsboxClient({ url: 'http://127.0.0.1:1/?x=1' }), (e) => e instanceof TypeError && /query/.test(e.message));
  assert.equal(typeof defaultSocketPath(), 'string');
});

test('readFile: a buffer of its own, never a window into a pool that holds other bytes', async () => {
  await c.writeFile(ID, 'small.bin', new Uint8Array([1, 2, 3]));
  await c.exec(ID, 'true', { env: { API_KEY: 'sk-live-SECRET123' } });
  const buf = await c.readFile(ID, 'small.bin');
  assert.deepEqual([...buf], [1, 2, 3]);
  assert.equal(buf.byteOffset, 0);
  assert.equal(buf.buffer.byteLength, 3, 'the ArrayBuffer behind it is exactly the file');
});

test('writeFile of content that is not bytes: a TypeError before any request', async () => {
  for (const bad of [123, null, {}, new ArrayBuffer(4)]) {
    await assert.rejects(c.writeFile(ID, 'never.txt', bad), (e) => e instanceof TypeError && /writeFile's content/.test(e.message), String(bad));
  }
  assert.equal(await c.exists(ID, 'never.txt'), false);
});

test('exec options: env undefined unsets, a bad timeoutMs is a RangeError', async () => {
  const r = await c.exec(ID, 'echo ${HOME-unset} ${KEEP}', { env: { HOME: undefined, KEEP: 'k' } });
  assert.equal(r.stdout, 'unset k\n');
  for (const t of [NaN, -1, 1.5, Infinity, '100']) {
    await assert.rejects(c.exec(ID, 'true', { timeoutMs: t }), (e) => e instanceof RangeError && /timeoutMs/.test(e.message), String(t));
  }
  assert.equal((await c.exec(ID, 'echo no deadline', { timeoutMs: 0 })).stdout, 'no deadline\n');
});

test('errors: errno as Node numbers it, no path or syscall where there is none', async () => {
  const e = await rejects(c.readFile(ID, 'no/such/file'), 'ENOENT');
  assert.equal(e.errno, -2);
  assert.equal(e.syscall, 'open');
  const api = await rejects(c.getSandbox('no-such-sandbox'), 'sandbox_not_found');
  assert.equal(Object.hasOwn(api, 'path'), false);
  assert.equal(Object.hasOwn(api, 'syscall'), false);
  assert.equal(Object.hasOwn(api, 'errno'), false);
});

test('a URL with a path: every request goes under it (nsboxd behind a reverse proxy)', async () => {
  const t = new NsboxClient({ url: `${d.url}/behind/proxy/`, token: d.token });
  assert.equal(t.endpoint, `${d.url}/behind/proxy`);
  // nsboxd itself has no such prefix: its 404 shows the path went out with it.
  await rejects(t.health(), 'not_found');
  t.close();
});

test('an answer that is not JSON: an NsboxError saying so, not a SyntaxError', async () => {
  const socketPath = join(tmpdir(), `nsbox-not-json-${process.pid}.sock`);
  const server = createServer((req, res) => res.end('<html>hello</html>'));
  await new Promise((resolve) => server.listen(socketPath, resolve));
  try {
    const other = new NsboxClient({ socketPath });
    const e = await rejects(other.health(), 'invalid_answer');
    assert.match(e.message, /not JSON/);
    assert.match(e.message, /<html>hello/);
    other.close();
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
});

test('an error page from a server that is not nsboxd: invalid_answer, a short message', async () => {
  // A real HTTP server (a web server where nsboxd was expected): its 404 is a whole HTML page.
  const page = '<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head><body>' + '<p>padding</p>'.repeat(400) + '</body></html>\n';
  const server = createServer((req, res) => {
    res.writeHead(404, { 'content-type': 'text/html; charset=utf-8' });
    res.end(page);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const other = new NsboxClient({ url: `http://127.0.0.1:${server.address().port}` });
    const e = await rejects(other.getSandbox('x'), 'invalid_answer');
    assert.ok(e instanceof NsboxError);
    assert.equal(e.status, 404);
    assert.match(e.message, /HTTP 404 \(text\/html; charset=utf-8\)/);
    assert.match(e.message, /is it nsboxd\?/);
    assert.match(e.message, /It began: "<!DOCTYPE html>\\n<html><head><title>404 Not Found/);
    assert.ok(e.message.length < 400, `a short message, not the page: ${e.message.length} characters`);
    assert.ok(!e.message.includes('\n'), 'one line: the page\'s newlines are escaped');
    other.close();
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
});

test('the README\'s script (examples/script.ts): Ctrl-C in its stream ends it with one line and 130', async () => {
  // The example as a user runs it: compiled, importing 'nsbox' (this package), the daemon found
  // through NSBOX_SOCKET; SIGINT once the stream has printed its first line.
  const ts = (await import('typescript')).default;
  const source = readFileSync(new URL('../examples/script.ts', import.meta.url), 'utf8');
  const js = ts.transpileModule(source, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
  const script = new URL(`./.script-example-${process.pid}.mjs`, import.meta.url);
  writeFileSync(script, js);
  try {
    const env = { ...process.env, NSBOX_SOCKET: d.socketPath };
    delete env.NSBOX_URL;
    delete env.NSBOX_TOKEN;
    const child = spawn(process.execPath, [fileURLToPath(script)], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    child.stdout.on('data', (b) => (out += b));
    child.stderr.on('data', (b) => (err += b));
    const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    for (let i = 0; i < 600 && !/^1$/m.test(out); i++) await new Promise((r) => setTimeout(r, 50));
    assert.match(out, /^1$/m, `the stream's first line; stdout: ${out}, stderr: ${err}`);
    child.kill('SIGINT');
    const { code, signal } = await exited;
    assert.equal(signal, null, err);
    assert.equal(code, 130, err);
    assert.equal(err, 'interrupted: the command was killed in the sandbox\n');
    assert.doesNotMatch(out, /^exit /m, 'the stream did not run to its end');
  } finally {
    rmSync(script, { force: true });
    await c.deleteSandbox('demo').catch(() => {});
  }
});

test('deleteSandbox: 204 then sandbox_not_found', async () => {
  await c.deleteSandbox(ID);
  await rejects(c.getSandbox(ID), 'sandbox_not_found');
  await rejects(c.deleteSandbox(ID), 'sandbox_not_found');
});

test('exposePort / listPorts / closePort: a host port relayed into the sandbox', async () => {
  const id = 'ports';
  await c.putSandbox(id);
  await c.exec(id, 'busybox nc -ll -p 3000 -e cat </dev/null >/dev/null 2>&1 &');
  const p = await c.exposePort(id, 3000);
  assert.equal(p.port, 3000);
  assert.equal(p.address, '127.0.0.1');
  assert.ok(p.hostPort > 0);
  assert.equal(p.url, `http://127.0.0.1:${p.hostPort}/`);
  assert.deepEqual(await c.listPorts(id), [p]);
  await rejects(c.exposePort(id, 3000), 'port_already_exposed');
  await rejects(c.exposePort(id, 70000), 'invalid_request');
  const net = await import('node:net');
  let echoed = '';
  for (let i = 0; i < 50 && echoed !== 'ping'; i++) {
    echoed = await new Promise((resolve) => {
      const s = net.connect(p.hostPort, '127.0.0.1', () => s.end('ping'));
      let got = '';
      s.on('data', (b) => (got += b.toString()));
      s.on('close', () => resolve(got));
      s.on('error', () => resolve(''));
    });
    if (echoed !== 'ping') await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(echoed, 'ping');
  await c.closePort(id, 3000);
  assert.deepEqual(await c.listPorts(id), []);
  await rejects(c.closePort(id, 3000), 'not_found');
  await c.deleteSandbox(id);
});
