// The client on its own, from a plain script.
import { NsboxClient, NsboxError } from 'nsbox';

const nsbox = new NsboxClient(); // the daemon found as the CLI finds it; or { socketPath } / { url, token }

const box = await nsbox.putSandbox('demo', { limits: { memoryBytes: 1 << 30 } });
console.log(`${box.id}: ${box.created ? 'created' : 'found'}, cwd ${box.cwd}`);

await nsbox.writeFile('demo', 'src/hi.py', 'print("hi from the sandbox")\n');
const r = await nsbox.exec('demo', 'python3 src/hi.py', { timeoutMs: 10_000 });
console.log(r.exitCode, r.stdout);

// Streaming: events as they come; Ctrl-C (or break) kills the command in the sandbox. The
// aborted stream rejects with an AbortError: end with one line and 130, as a shell would.
const ac = new AbortController();
process.once('SIGINT', () => ac.abort());
try {
  for await (const ev of nsbox.execStream('demo', 'for i in 1 2 3; do echo $i; sleep 1; done', { signal: ac.signal })) {
    if (ev.type === 'stdout') process.stdout.write(ev.data ?? '');
    if (ev.type === 'exit') console.log(`exit ${ev.exitCode} (${ev.reason})`);
  }
} catch (e) {
  if ((e as { name?: unknown } | null)?.name !== 'AbortError') throw e;
  console.error('interrupted: the command was killed in the sandbox');
  nsbox.close();
  process.exit(130);
}

try {
  await nsbox.readFile('demo', 'missing.txt');
} catch (e) {
  if (e instanceof NsboxError && e.code === 'ENOENT') console.log(e.message);
  else throw e;
}
console.log(await nsbox.readdir('demo', '.', { withTypes: true }));
nsbox.close();
