// nsbox(options) as a Flue SandboxFactory: runs on Node 20 (only @flue/runtime's main entry).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { nsbox, NsboxClient } from '../dist/flue.js';
import { startDaemon } from './daemon.mjs';

let d;
before(async () => { d = await startDaemon(); });
after(async () => { await d?.stop(); });

test('createSandbox: find-or-create by id; the workspace survives a new factory and a stop', async () => {
  const s1 = await nsbox({ socketPath: d.socketPath }).createSandbox({ id: 'conv-1' });
  assert.equal(s1.cwd, '/workspace');
  await s1.writeFile('notes/a.md', '# hi\n');
  const client = new NsboxClient({ socketPath: d.socketPath });
  await client.stopSandbox('conv-1');
  const s2 = await nsbox({ client }).createSandbox({ id: 'conv-1' });
  assert.equal(await s2.readFile('/workspace/notes/a.md'), '# hi\n');
  assert.equal(s2.resolvePath('notes/../x'), '/workspace/x');
  // repeated concurrent calls with the same id are fine
  const many = await Promise.all([1, 2, 3].map(() => nsbox({ client }).createSandbox({ id: 'conv-1' })));
  assert.equal(many.length, 3);
  client.close();
});

test('creation options apply: cwd, env, idPrefix', async () => {
  const f = nsbox({ socketPath: d.socketPath, idPrefix: 'agent-', cwd: '/root', env: { MODE: 'test' } });
  const s = await f.createSandbox({ id: 'x' });
  assert.equal(s.cwd, '/root');
  const r = await s.exec('pwd; echo $MODE');
  assert.deepEqual(r, { stdout: '/root\ntest\n', stderr: '', exitCode: 0 });
  const info = await new NsboxClient({ socketPath: d.socketPath }).getSandbox('agent-x');
  assert.equal(info.id, 'agent-x');
});

test('exec: timeoutMs forwarded (124), signal aborts with AbortError and kills', async () => {
  const s = await nsbox({ socketPath: d.socketPath }).createSandbox({ id: 'conv-2' });
  const t0 = Date.now();
  const r = await s.exec('sleep 20', { timeoutMs: 200 });
  assert.equal(r.exitCode, 124);
  assert.ok(Date.now() - t0 < 5000);
  const ac = new AbortController();
  const p = s.exec('echo $$ > /tmp/p; sleep 20', { signal: ac.signal });
  await new Promise((res) => setTimeout(res, 400));
  const reason = new Error('user pressed stop');
  ac.abort(reason);
  const err = await p.then(() => null, (e) => e);
  assert.equal(err?.name, 'AbortError');
  assert.equal(err.cause, reason);
  await new Promise((res) => setTimeout(res, 300));
  assert.equal((await s.exec('kill -0 $(cat /tmp/p) 2>/dev/null && echo alive || echo gone')).stdout, 'gone\n');
});

test('exec: a sandbox stopped under the command is SandboxDiedError, not an exit code', async () => {
  const client = new NsboxClient({ socketPath: d.socketPath });
  const s = await nsbox({ client }).createSandbox({ id: 'died' });
  const p = s.exec('sleep 30').then(() => null, (e) => e);
  await new Promise((res) => setTimeout(res, 400));
  await client.stopSandbox('died');
  const err = await p;
  assert.equal(err?.name, 'SandboxDiedError', String(err));
  assert.equal(err.type, 'sandbox_died');
  // The next call starts the sandbox again.
  assert.equal((await s.exec('echo back')).stdout, 'back\n');
  client.close();
});

test('exec: cancelled by another client or killed for memory is exit 1 with a line saying why', async () => {
  const client = new NsboxClient({ socketPath: d.socketPath });
  const s = await nsbox({ client }).createSandbox({ id: 'why' });
  const p = s.exec('echo before; sleep 30');
  let running = [];
  for (let i = 0; i < 50 && running.length === 0; ++i) {
    await new Promise((res) => setTimeout(res, 50));
    running = await client.listExecs('why');
  }
  assert.equal(running.length, 1);
  await client.cancelExec('why', running[0].execId);
  const r = await p;
  assert.equal(r.exitCode, 1);
  assert.equal(r.stdout, 'before\n');
  assert.match(r.stderr, /^nsbox: the command was cancelled/m);

  const small = await nsbox({ client, limits: { memoryBytes: 64 * 1024 * 1024 } }).createSandbox({ id: 'oom' });
  const bomb = await small.exec("python3 -c \"b = bytearray(b'x') * (512 << 20)\"");
  assert.equal(bomb.exitCode, 1, JSON.stringify(bomb));
  assert.match(bomb.stderr, /memory limit was reached\n$/);
  assert.equal((await small.exec('echo alive')).stdout, 'alive\n');
  client.close();
});

test('limits.diskBytes: a disk of its own, full as a full disk is for Node (ENOSPC)', async () => {
  const s = await nsbox({ socketPath: d.socketPath, limits: { diskBytes: 32 * 1024 * 1024 } }).createSandbox({ id: 'disk' });
  await assert.rejects(s.writeFile('/workspace/big', new Uint8Array(40 * 1024 * 1024)), (e) => e.code === 'ENOSPC', 'a file larger than the disk');
  const size = Number((await s.exec('df -B1 --output=size /workspace | tail -1')).stdout);
  assert.ok(size > 16 * 1024 * 1024 && size <= 32 * 1024 * 1024, String(size));
  await s.writeFile('/workspace/small', 'fits');
  assert.equal(await s.readFile('/workspace/small'), 'fits');
});

test('idleStopMs: an idle sandbox stops; its files stay and the next call starts it again', async () => {
  const client = new NsboxClient({ socketPath: d.socketPath });
  const s = await nsbox({ client, idleStopMs: 1000 }).createSandbox({ id: 'idle' });
  assert.equal((await client.getSandbox('idle')).idleStopMs, 1000);
  await s.writeFile('kept.txt', 'still here');
  const deadline = Date.now() + 10000;
  while ((await client.getSandbox('idle')).state !== 'stopped') {
    assert.ok(Date.now() < deadline, 'still running 10 s after its last use');
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  assert.equal(await s.readFile('kept.txt'), 'still here');
  assert.equal((await client.getSandbox('idle')).state, 'running');
  assert.throws(() => nsbox({ idleStopMs: 999 }), /idleStopMs/);
  assert.throws(() => nsbox({ idleStopMs: 1500.5 }), /idleStopMs/);
  nsbox({ idleStopMs: 0 }); // never: accepted
  client.close();
});

test('exec: timeoutMs 0 is no deadline, a fraction rounds up, nonsense is a RangeError', async () => {
  const s = await nsbox({ socketPath: d.socketPath }).createSandbox({ id: 'deadlines' });
  assert.deepEqual(await s.exec('sleep 0.3; echo done', { timeoutMs: 0 }), { stdout: 'done\n', stderr: '', exitCode: 0 });
  assert.equal((await s.exec('echo ok', { timeoutMs: 5000.5 })).exitCode, 0);
  for (const t of [NaN, -5, Infinity]) {
    await assert.rejects(s.exec('true', { timeoutMs: t }), (e) => e instanceof RangeError, String(t));
  }
});

test('readFileBuffer: exactly the file, nothing else of the process behind it', async () => {
  const s = await nsbox({ socketPath: d.socketPath }).createSandbox({ id: 'bytes' });
  await s.writeFile('img.bin', new Uint8Array([1, 2, 3]));
  await s.exec('true', { env: { API_KEY: 'sk-live-SECRET123' } });
  const u = await s.readFileBuffer('img.bin');
  assert.deepEqual([...u], [1, 2, 3]);
  assert.equal(u.buffer.byteLength, 3);
});

test('exists never throws for a path, but throws when the daemon is unreachable', async () => {
  const s = await nsbox({ socketPath: d.socketPath }).createSandbox({ id: 'conv-3' });
  assert.equal(await s.exists('no/such/thing'), false);
  assert.equal(await s.exists('/'), true);
  const other = await startDaemon();
  const s2 = await nsbox({ socketPath: other.socketPath }).createSandbox({ id: 'gone' });
  await other.stop();
  await assert.rejects(s2.exists('anything'), (e) => e.code === 'daemon_unreachable' && e.message.includes(other.socketPath));
});

test('a daemon that is not running: createSandbox rejects naming the socket', async () => {
  await assert.rejects(
    nsbox({ socketPath: '/nonexistent/nsboxd.sock' }).createSandbox({ id: 'a' }),
    (e) => e.code === 'daemon_unreachable' && e.message.includes('/nonexistent/nsboxd.sock'),
  );
});

test('invalid options: TypeError saying which', () => {
  const cases = [
    [{ socketPath: 42 }, /socketPath/],
    [{ url: 'nope' }, /url/],
    [{ cwd: 'relative' }, /cwd/],
    [{ env: ['A=1'] }, /env/],
    [{ env: { A: 1 } }, /env/],
    [{ limits: { memoryBytes: -1 } }, /limits\.memoryBytes/],
    [{ limits: { bogus: 1 } }, /bogus/],
    [{ client: {} }, /client/],
    [{ socketPath: '/a', url: 'http://b' }, /socketPath|url/],
    [{ sockPath: '/a' }, /sockPath/],
    ['string', /options/],
  ];
  for (const [options, re] of cases) {
    assert.throws(() => nsbox(options), (e) => e instanceof TypeError && re.test(e.message), JSON.stringify(options));
  }
});

test('package exports: `nsbox` and `nsbox/flue` resolve by name', async () => {
  const main = await import('nsbox');
  const flue = await import('nsbox/flue');
  assert.equal(typeof main.NsboxClient, 'function');
  assert.equal(typeof flue.nsbox, 'function');
  assert.equal(flue.NsboxClient, main.NsboxClient);
});
