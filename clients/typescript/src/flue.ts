import { SandboxDiedError, sandboxFromDriver, type FileStat, type Sandbox, type SandboxDriver, type SandboxFactory, type ShellResult } from '@flue/runtime';
import { NsboxClient, type NetworkPolicy, type NsboxClientOptions, type SandboxCreateOptions, type SandboxLimits } from './client.js';

/** Options of {@link nsbox}: where the daemon is, and how new sandboxes are made. */
export interface NsboxSandboxOptions extends NsboxClientOptions {
  /** A client to use instead of making one from `socketPath` / `url` / `token`. */
  client?: NsboxClient;
  /** Prepended to the agent instance id to name the sandbox (`"agent-"` + `ctx.id`). */
  idPrefix?: string;
  /** Image of new sandboxes (default `host`). */
  image?: string;
  /** Working directory of new sandboxes (default `/workspace`). */
  cwd?: string;
  /** Base environment of new sandboxes, layered over nsbox's own. */
  env?: Record<string, string>;
  /** Resource limits of new sandboxes. */
  limits?: SandboxLimits;
  /** Network policy of new sandboxes (default `"none"`: loopback only). */
  network?: NetworkPolicy;
  /**
   * New sandboxes stop once idle this long (ms, 1,000 to 30 days): their files stay, their
   * processes and /tmp do not, and the next call starts them again. 0: never. Default: as the
   * daemon's `--idle-stop` says (never without it).
   */
  idleStopMs?: number;
}

const KNOWN = new Set(['client', 'socketPath', 'url', 'token', 'idPrefix', 'image', 'cwd', 'env', 'limits', 'network', 'idleStopMs']);

function fail(message: string): never {
  throw new TypeError(`nsbox(): ${message}`);
}

function validate(options: unknown): asserts options is NsboxSandboxOptions {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    fail(`options must be an object, got ${options === null ? 'null' : Array.isArray(options) ? 'an array' : typeof options}`);
  }
  const o = options as Record<string, unknown>;
  for (const key of Object.keys(o)) if (!KNOWN.has(key)) fail(`unknown option \`${key}\``);
  for (const key of ['idPrefix', 'image', 'cwd'] as const) {
    if (o[key] !== undefined && typeof o[key] !== 'string') fail(`option \`${key}\` must be a string, got ${typeof o[key]}`);
  }
  if (o.network !== undefined && typeof o.network !== 'string' && (o.network === null || typeof o.network !== 'object' || Array.isArray(o.network))) {
    fail('option `network` must be "none", "open" or { allow: string[], open?: boolean }');
  }
  if (typeof o.cwd === 'string' && !o.cwd.startsWith('/')) fail(`option \`cwd\` must be an absolute path, got ${JSON.stringify(o.cwd)}`);
  if (o.env !== undefined) {
    if (o.env === null || typeof o.env !== 'object' || Array.isArray(o.env)) fail('option `env` must be a Record<string, string>');
    for (const [k, v] of Object.entries(o.env as object)) {
      if (typeof v !== 'string') fail(`option \`env\`: the value of ${JSON.stringify(k)} must be a string, got ${typeof v}`);
    }
  }
  if (o.limits !== undefined) {
    if (o.limits === null || typeof o.limits !== 'object' || Array.isArray(o.limits)) fail('option `limits` must be an object');
    for (const [k, v] of Object.entries(o.limits as object)) {
      if (!['memoryBytes', 'pids', 'cpus', 'diskBytes', 'outputBytes'].includes(k)) fail(`option \`limits\`: unknown limit \`${k}\``);
      if (typeof v !== 'number' || !(v > 0) || !Number.isFinite(v)) fail(`option \`limits.${k}\` must be a positive number, got ${JSON.stringify(v)}`);
    }
  }
  if (o.idleStopMs !== undefined && (typeof o.idleStopMs !== 'number' || !Number.isInteger(o.idleStopMs) || (o.idleStopMs !== 0 && o.idleStopMs < 1000) || o.idleStopMs > 30 * 24 * 3600 * 1000)) {
    fail(`option \`idleStopMs\` must be 0 (never) or a whole number of milliseconds from 1000 to 30 days, got ${JSON.stringify(o.idleStopMs)}`);
  }
  if (o.client !== undefined && !(o.client instanceof NsboxClient)) fail('option `client` must be an NsboxClient');
  if (o.client !== undefined && (o.socketPath !== undefined || o.url !== undefined || o.token !== undefined)) {
    fail('option `client` excludes `socketPath`, `url` and `token`');
  }
}

/** The `SandboxDriver` of one nsbox sandbox: every verb is one API call. */
export function nsboxDriver(client: NsboxClient, id: string): SandboxDriver {
  return {
    async readFile(path: string): Promise<string> {
      return (await client.readFile(id, path)).toString('utf8');
    },
    async readFileBuffer(path: string): Promise<Uint8Array> {
      const buf = await client.readFile(id, path);
      return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    },
    async writeFile(path: string, content: string | Uint8Array): Promise<void> {
      await client.writeFile(id, path, content);
    },
    async stat(path: string): Promise<FileStat> {
      const s = await client.stat(id, path);
      return {
        isFile: s.isFile,
        isDirectory: s.isDirectory,
        isSymbolicLink: s.isSymbolicLink,
        size: s.size,
        mtime: new Date(Math.round(s.mtimeMs)),  // as Node's Stats rounds it
      };
    },
    async readdir(path: string): Promise<string[]> {
      return client.readdir(id, path);
    },
    async exists(path: string): Promise<boolean> {
      // The API never answers an error for the path itself; an unreachable daemon still throws.
      return client.exists(id, path);
    },
    async mkdir(path: string, options?: { recursive?: boolean }): Promise<void> {
      await client.mkdir(id, path, { recursive: options?.recursive ?? false });
    },
    async rm(path: string, options?: { recursive?: boolean; force?: boolean }): Promise<void> {
      await client.rm(id, path, { recursive: options?.recursive ?? false, force: options?.force ?? false });
    },
    async exec(
      command: string,
      options?: { cwd?: string; env?: Record<string, string>; timeoutMs?: number; signal?: AbortSignal },
    ): Promise<ShellResult> {
      // timeoutMs goes to nsboxd (exit 124 at the deadline); the signal ends the request, which
      // makes nsboxd kill the command's whole process tree at once.
      const execOptions: Parameters<NsboxClient['exec']>[2] = {};
      if (options?.cwd !== undefined) execOptions.cwd = options.cwd;
      if (options?.env !== undefined) execOptions.env = options.env;
      if (options?.timeoutMs !== undefined) {
        const t = options.timeoutMs;
        // As Node's child_process checks it (local()), but a fraction is rounded up, as the
        // contract allows; 0 is no deadline there and here (it was raised to 1 ms: a kill at once).
        if (typeof t !== 'number' || Number.isNaN(t) || t < 0 || !Number.isFinite(t)) {
          throw new RangeError(`The value of "timeoutMs" is out of range. It must be a finite number >= 0. Received ${String(t)}`);
        }
        if (t > 0) execOptions.timeoutMs = Math.ceil(t);
      }
      if (options?.signal !== undefined) execOptions.signal = options.signal;
      const r = await client.exec(id, command, execOptions);
      if (r.reason === 'timeout' && options?.signal !== undefined) {
        // nsboxd's deadline starts after the caller's own timer (Flue's bash tool sets one with
        // the same timeoutMs), so that timer is due by now; on a busy host Node may still read
        // this answer before running it. One turn of the timers lets it fire, and the caller sees
        // its signal aborted, as local() makes it see: its exec ends on the same signal.
        await new Promise((resolve) => setTimeout(resolve, 0));
      }
      // The sandbox was stopped or deleted under the command: an infrastructure failure, which
      // the contract asks an adapter to report as SandboxDiedError, not as an exit code 137.
      if (r.reason === 'stopped') throw new SandboxDiedError({ operation: 'exec', reason: 'stopped' });
      let stderr = r.stderr ?? '';
      // local() reports a signal death it did not cause as the generic exit code 1 (nsboxd says
      // 128+N and names the signal); keep local()'s value so swapping the two changes nothing.
      // The memory limit's kill and another client's cancel are such deaths too; a line on stderr
      // says which, since nothing else would tell the model.
      if (r.reason === 'oom' || r.reason === 'cancelled') {
        if (stderr !== '' && !stderr.endsWith('\n')) stderr += '\n';
        stderr +=
          r.reason === 'oom'
            ? "nsbox: the command was killed: the sandbox's memory limit was reached\n"
            : 'nsbox: the command was cancelled (DELETE .../execs/{execId})\n';
      }
      const exitCode = r.reason === 'signaled' || r.reason === 'oom' || r.reason === 'cancelled' ? 1 : r.exitCode;
      return { stdout: r.stdout ?? '', stderr, exitCode };
    },
  };
}

/**
 * A Flue `SandboxFactory` over nsbox: `createSandbox({ id })` finds or creates the sandbox of
 * that id (so a conversation keeps its workspace across messages and restarts) and returns
 * `sandboxFromDriver(driver, cwd)`. Swap it for `local()` in `useSandbox(...)`.
 */
export function nsbox(options: NsboxSandboxOptions = {}): SandboxFactory {
  validate(options);
  const { client: given, socketPath, url, token, idPrefix = '', image, cwd, env, limits, network, idleStopMs } = options;
  const clientOptions: NsboxClientOptions = {};
  if (socketPath !== undefined) clientOptions.socketPath = socketPath;
  if (url !== undefined) clientOptions.url = url;
  if (token !== undefined) clientOptions.token = token;
  const client = given ?? new NsboxClient(clientOptions);
  const create: SandboxCreateOptions = {};
  if (image !== undefined) create.image = image;
  if (cwd !== undefined) create.cwd = cwd;
  if (env !== undefined) create.env = env;
  if (limits !== undefined) create.limits = limits;
  if (network !== undefined) create.network = network;
  if (idleStopMs !== undefined) create.idleStopMs = idleStopMs;
  return {
    async createSandbox({ id }: { id: string }): Promise<Sandbox> {
      if (typeof id !== 'string' || id === '') throw new TypeError('nsbox(): createSandbox needs a non-empty string id');
      const sandboxId = idPrefix + id;
      const info = await client.putSandbox(sandboxId, Object.keys(create).length > 0 ? create : undefined);
      return sandboxFromDriver(nsboxDriver(client, sandboxId), info.cwd);
    },
  };
}

export { NsboxClient, NsboxError } from './index.js';
export type { NsboxClientOptions } from './index.js';
