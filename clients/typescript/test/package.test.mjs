// The package as npm users get it: `npm pack`, the tarball installed in an empty directory
// (offline: the package has no runtime dependencies), then, from that directory and importing
// `nsbox` from node_modules, against a real nsboxd:
//   - examples/script.ts run to its end, its output checked;
//   - every ```ts block of README.md type-checked against the installed package's own types, and
//     run unless the block is marked `<!-- doc: not run: REASON -->`.
// Needs dist/ built (test.sh builds it) and root for the daemon, as the other suites.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync, writeFileSync, symlinkSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { NsboxClient } from '../dist/index.js';
import { startDaemon } from './daemon.mjs';

const pkg = fileURLToPath(new URL('..', import.meta.url));
const repo = join(pkg, '..', '..');
let d, dir, app, tarball, packed;

/** Runs a command; its output, or a failure with everything it printed. */
function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 120_000, ...opts });
  if (r.error) throw new Error(`${cmd} ${args.join(' ')}: ${r.error.message}`);
  return r;
}
function ok(cmd, args, opts = {}) {
  const r = run(cmd, args, opts);
  assert.equal(r.status, 0, `${cmd} ${args.join(' ')} exited ${r.status}:\n${r.stdout}${r.stderr}`);
  return r;
}

/**
 * npm's environment: a registry nothing listens on, so that any attempt to reach the network
 * fails the step instead of passing on a machine that is online.
 */
const npmEnv = { ...process.env, npm_config_registry: 'http://127.0.0.1:9/', npm_config_update_notifier: 'false', npm_config_audit: 'false', npm_config_fund: 'false' };

/** The environment of a user's script: the test's daemon through NSBOX_SOCKET, nothing else. */
function userEnv() {
  const env = { ...process.env, NSBOX_SOCKET: d.socketPath };
  delete env.NSBOX_URL;
  delete env.NSBOX_TOKEN;
  return env;
}

/**
 * The ```ts blocks of a Markdown text: { line, file, code, notRun }. A block whose first line is a
 * comment naming a .ts path (`// src/agents/coder.ts`) is that file; any other is readme-LINE.ts.
 * `notRun` is the reason of a `<!-- doc: not run: REASON -->` on the line before the fence.
 */
export function tsBlocks(markdown) {
  const lines = markdown.split('\n');
  const blocks = [];
  for (let i = 0; i < lines.length; i++) {
    if (lines[i].trim() !== '```ts') continue;
    const start = i;
    const body = [];
    for (i++; i < lines.length && lines[i].trim() !== '```'; i++) body.push(lines[i]);
    let before = start - 1;
    while (before >= 0 && lines[before].trim() === '') before--;
    const marker = before >= 0 ? /^<!-- doc: not run: (.+?) -->$/.exec(lines[before].trim()) : null;
    const named = /^\/\/ ([\w./-]+\.ts)$/.exec(body[0] ?? '');
    blocks.push({
      line: start + 1,
      file: named ? named[1] : `readme-${start + 1}.ts`,
      code: body.join('\n') + '\n',
      notRun: marker ? marker[1] : undefined,
    });
  }
  return blocks;
}

before(async () => {
  d = await startDaemon();
  dir = mkdtempSync(join(tmpdir(), 'nsbox-ts-package-'));
  // npm pack, as the publisher does: the tarball and the list of what it ships.
  const pack = ok('npm', ['pack', '--json', '--pack-destination', dir, '--loglevel=error'], { cwd: pkg, env: npmEnv });
  packed = JSON.parse(pack.stdout)[0];
  tarball = join(dir, packed.filename);
  // An empty directory, a new project, the tarball installed without the network.
  app = join(dir, 'app');
  mkdirSync(app);
  ok('npm', ['init', '-y'], { cwd: app, env: npmEnv });
  ok('npm', ['pkg', 'set', 'type=module'], { cwd: app, env: npmEnv });
  ok('npm', ['install', '--offline', '--no-audit', '--no-fund', '--loglevel=error', tarball], { cwd: app, env: npmEnv });
  // The README's Flue snippets import @flue/runtime, an optional peer the user installs; here the
  // devDependency's (and the Node types a TypeScript user has) stand in, linked, not downloaded.
  mkdirSync(join(app, 'node_modules', '@types'), { recursive: true });
  symlinkSync(join(pkg, 'node_modules', '@flue'), join(app, 'node_modules', '@flue'));
  symlinkSync(join(pkg, 'node_modules', '@types', 'node'), join(app, 'node_modules', '@types', 'node'));
  // A TypeScript user's settings for Node's ESM: NodeNext, strict.
  writeFileSync(
    join(app, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        target: 'ES2022',
        module: 'NodeNext',
        moduleResolution: 'NodeNext',
        lib: ['ES2022', 'ESNext.Disposable'],
        types: ['node'],
        strict: true,
        skipLibCheck: true,
        rootDir: '.',
        outDir: 'out',
      },
      include: ['**/*.ts'],
      exclude: ['node_modules', 'out'],
    }),
  );
});
after(async () => {
  await d?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('the tarball ships dist/, README.md and package.json, with the project\'s version', () => {
  const files = packed.files.map((f) => f.path).sort();
  assert.ok(files.includes('README.md'), files.join(' '));
  assert.ok(files.includes('dist/index.js') && files.includes('dist/index.d.ts'), files.join(' '));
  assert.ok(files.includes('dist/flue.js') && files.includes('dist/flue.d.ts'), files.join(' '));
  assert.deepEqual(files.filter((f) => !/^(dist\/|README\.md$|package\.json$)/.test(f)), []);
  const cmake = /project\(nsbox VERSION (\d+\.\d+\.\d+)/.exec(readFileSync(join(repo, 'CMakeLists.txt'), 'utf8'));
  assert.ok(cmake, 'CMakeLists.txt has project(nsbox VERSION X.Y.Z)');
  const installed = JSON.parse(readFileSync(join(app, 'node_modules', 'nsbox', 'package.json'), 'utf8'));
  assert.equal(installed.version, cmake[1]);
  assert.equal(packed.filename, `nsbox-${cmake[1]}.tgz`);
  assert.deepEqual(installed.dependencies ?? {}, {}, 'no runtime dependencies');
  assert.ok(readFileSync(join(pkg, 'README.md'), 'utf8').includes(`npm install ./${packed.filename}`), 'the README installs this tarball');
});

test('the installed README sends its reader nowhere outside the package', () => {
  const readme = readFileSync(join(app, 'node_modules', 'nsbox', 'README.md'), 'utf8');
  assert.equal(readme, readFileSync(join(pkg, 'README.md'), 'utf8'));
  // Every link target that is not a URL (inline or a reference), outside code.
  const prose = readme.replace(/```[\s\S]*?```/g, '').replace(/`[^`\n]*`/g, '');
  const targets = [...prose.matchAll(/\]\(\s*<?([^)\s>]+)/g), ...prose.matchAll(/^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?$/gm)].map((m) => m[1]);
  const local = targets.filter((t) => !/^[a-z][a-z0-9+.-]*:/i.test(t) && !t.startsWith('#'));
  assert.deepEqual(local, [], 'links to files that the npm page does not have');
});

test('examples/script.ts, compiled in the new project, runs to its end against nsboxd', async () => {
  writeFileSync(join(app, 'script.ts'), readFileSync(join(pkg, 'examples', 'script.ts')));
  ok(process.execPath, [join(pkg, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', '.'], { cwd: app });
  const r = run(process.execPath, ['out/script.js'], { cwd: app, env: userEnv() });
  rmSync(join(app, 'script.ts'));
  rmSync(join(app, 'out'), { recursive: true, force: true });
  try {
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.equal(r.stderr, '');
    const lines = r.stdout.split('\n');
    assert.equal(lines[0], 'demo: created, cwd /workspace');
    assert.equal(lines[1], '0 hi from the sandbox');
    assert.deepEqual(lines.slice(3, 7), ['1', '2', '3', 'exit 0 (exited)']);
    assert.equal(lines[7], "ENOENT: no such file or directory, open '/workspace/missing.txt'");
    assert.match(r.stdout, /name: 'src', type: 'directory'/);
  } finally {
    const c = new NsboxClient({ socketPath: d.socketPath });
    await c.deleteSandbox('demo').catch(() => {});
    c.close();
  }
});

test('every ```ts block of README.md type-checks against the installed package, and runs unless marked', () => {
  const blocks = tsBlocks(readFileSync(join(pkg, 'README.md'), 'utf8'));
  assert.ok(blocks.length >= 4, `${blocks.length} blocks`);
  const proj = join(dir, 'readme');
  rmSync(proj, { recursive: true, force: true });
  mkdirSync(proj);
  for (const name of ['package.json', 'node_modules', 'tsconfig.json']) {
    if (name === 'tsconfig.json') writeFileSync(join(proj, name), readFileSync(join(app, name)));
    else symlinkSync(join(app, name), join(proj, name));
  }
  for (const b of blocks) {
    mkdirSync(dirname(join(proj, b.file)), { recursive: true });
    assert.ok(!existsSync(join(proj, b.file)), `two blocks are ${b.file}`);
    writeFileSync(join(proj, b.file), b.code);
  }
  const tsc = run(process.execPath, [join(pkg, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', '.'], { cwd: proj });
  assert.equal(tsc.status, 0, `the README's snippets do not type-check (files: ${blocks.map((b) => `${b.file} = README.md:${b.line}`).join(', ')}):\n${tsc.stdout}${tsc.stderr}`);
  let ran = 0;
  for (const b of blocks) {
    if (b.notRun) continue;
    const js = join('out', b.file.replace(/\.ts$/, '.js'));
    const r = run(process.execPath, [js], { cwd: proj, env: userEnv() });
    assert.equal(r.status, 0, `README.md:${b.line} (${b.file}) exited ${r.status}:\n${r.stdout}${r.stderr}`);
    assert.equal(r.stderr, '', `README.md:${b.line} wrote to stderr`);
    if (b.code.includes('attachOutput')) assert.equal(r.stdout, 'two\nexit 0\n', 'the re-attach picks up after "one"');
    ran++;
  }
  assert.ok(ran >= 2, `${ran} blocks ran`);
});
