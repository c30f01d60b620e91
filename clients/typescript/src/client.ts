import * as http from 'node:http';
import * as https from 'node:https';
import { Readable } from 'node:stream';
import { abortError, NsboxError } from './errors.js';
import { accessHint, defaultSocketPaths, firstAnswering, noDaemonMessage } from './sockets.js';

/** How to reach nsboxd. Give at most one of `socketPath` and `url`. */
export interface NsboxClientOptions {
  /**
   * Unix socket of the daemon. Default: `$NSBOX_SOCKET`, else `/run/nsbox/nsboxd.sock` as root;
   * else, as the CLI, the user's own `$XDG_RUNTIME_DIR/nsbox/nsboxd.sock` and then
   * `/run/nsbox/nsboxd.sock`, the first that accepts a connection (`defaultSocketPaths()`).
   */
  socketPath?: string;
  /** `http://HOST:PORT` of a TCP listener (default `$NSBOX_URL`); needs `token`. */
  url?: string;
  /** Bearer token for the TCP listener (default `$NSBOX_TOKEN`). */
  token?: string;
}

export interface SandboxLimits {
  memoryBytes?: number;
  pids?: number;
  cpus?: number;
  diskBytes?: number;
  /** A command's stdout and stderr together, past which it is killed (default 64 MiB). */
  outputBytes?: number;
}

/**
 * A sandbox's network policy (docs/network.md): `"none"` (loopback only, the default), `"open"`
 * (all egress but the host, link-local addresses and other sandboxes), or an allowlist of
 * names, `*.` wildcards, IPv4 addresses and CIDRs with an optional `:port`, enforced by the
 * kernel; with `open: true` the listed entries are reachable on top of an open network.
 */
export type NetworkPolicy = 'none' | 'open' | { allow: string[]; open?: boolean };

export interface SandboxCreateOptions {
  image?: string;
  cwd?: string;
  env?: Record<string, string>;
  limits?: SandboxLimits;
  network?: NetworkPolicy;
  /**
   * Stop the sandbox once it has been idle this long, 1,000 ms to 30 days: no request using it
   * and no process of its own running. Its files stay; its processes and /tmp do not; the next
   * call starts it again (docs/daemon.md "Idle stop"). 0: never; without it, as the daemon's
   * `--idle-stop` says.
   */
  idleStopMs?: number;
}

export interface SandboxInfo {
  id: string;
  state: 'running' | 'stopped';
  image: string;
  cwd: string;
  createdAt: string;
  limits: SandboxLimits;
  network: NetworkPolicy;
  /** The idle stop in force (its own, or the daemon's default), or null: stopped only when asked. */
  idleStopMs?: number | null;
  /** The sandbox's IPv4 address while it runs with a network, else null. */
  address?: string | null;
  env?: Record<string, string>;
  [key: string]: unknown;
}

/** `PUT /v1/sandboxes/{id}`: the sandbox, and whether this call created it (201) or found it (200). */
export interface SandboxPutResult extends SandboxInfo {
  created: boolean;
}

/** A path inside the sandbox: a string, or the exact bytes (sent as `pathBase64`). */
export type SandboxPath = string | Uint8Array;

export interface ExecOptions {
  cwd?: string;
  /** Layered over the sandbox's base environment; `null` removes a base variable. */
  env?: Record<string, string | null>;
  timeoutMs?: number;
  /** Bytes fed to standard input, then EOF. Without it standard input is /dev/null. */
  stdin?: string;
  /** `base64`: output as `stdoutBase64`/`stderrBase64` (or `dataBase64` events), byte for byte. */
  encoding?: 'utf8' | 'base64';
  /** Aborting ends the request, which kills the command's whole process tree in the sandbox (unless `detach`). */
  signal?: AbortSignal;
  /** The command keeps running when this request hangs up; re-attach with `attachOutput` (docs/exec.md). */
  detach?: boolean;
  /** Standard input stays open after `stdin` and is fed with `sendStdin`. */
  stdinStream?: boolean;
  /** Run on a terminal of this size (`true`: 24x80); input is streamed, all output is stdout. */
  tty?: boolean | { rows: number; cols: number };
}

/** Options of `attachOutput` (`GET .../execs/{execId}/output`). */
export interface AttachOptions {
  /** The byte offset to replay from (stdout and stderr counted together); default 0. */
  offset?: number;
  /** Keep the stream open for live output until the exit event. */
  follow?: boolean;
  encoding?: 'utf8' | 'base64';
  /** Aborting ends this reader only: a re-attach never kills the command. */
  signal?: AbortSignal;
}

export type ExecReason = 'exited' | 'signaled' | 'timeout' | 'cancelled' | 'output_limit' | 'oom' | 'stopped';

/**
 * What the command used, from its own cgroups (nsbox docs/cgroups.md "Per-exec usage"). Each
 * figure is `null` where the host has no controller for it, never a made-up zero.
 */
export interface ExecUsage {
  cpuUserMs: number | null;
  cpuSystemMs: number | null;
  memoryPeakBytes: number | null;
  pidsPeak: number | null;
  ioReadBytes: number | null;
  ioWriteBytes: number | null;
}

export interface ExecResult {
  /** The output as text; absent with `encoding: 'base64'` (then `stdoutBase64`). */
  stdout?: string;
  /** Absent with `encoding: 'base64'` (then `stderrBase64`). */
  stderr?: string;
  stdoutBase64?: string;
  stderrBase64?: string;
  exitCode: number;
  reason: ExecReason;
  signal: string | null;
  timedOut: boolean;
  truncated: boolean;
  cancelled?: boolean;
  durationMs: number;
  /** Absent only from a daemon older than nsbox issue 8. */
  usage?: ExecUsage;
}

export type ExecEvent =
  | { type: 'start'; execId: string; pid: number }
  /**
   * `offset` of the first raw byte, `end` after the last (absent from a daemon before
   * 2026-12-07). To lose and repeat nothing, re-attach with the greatest `end` received: a text
   * event's bytes may be split by the other stream's (docs/exec.md).
   */
  | { type: 'stdout'; offset: number; end?: number; data?: string; dataBase64?: string }
  | { type: 'stderr'; offset: number; end?: number; data?: string; dataBase64?: string }
  | {
      type: 'exit';
      exitCode: number;
      reason: ExecReason;
      signal: string | null;
      timedOut: boolean;
      truncated: boolean;
      cancelled: boolean;
      durationMs: number;
      usage?: ExecUsage;
    };

export interface RunningExec {
  execId: string;
  [key: string]: unknown;
}

export interface StatResult {
  isFile: boolean;
  isDirectory: boolean;
  isSymbolicLink: boolean;
  size: number;
  mtimeMs: number;
  /** The target's type and permission bits, as Node's `Stats.mode` (`0o100755`). */
  mode: number;
}

export interface DirEntry {
  name: string;
  /** Present when `name` is not valid UTF-8: the exact bytes of the name. */
  nameBase64?: string;
  type: 'file' | 'directory' | 'symlink' | 'other';
}

export interface HealthResult {
  ok: boolean;
  version: string;
}

/** An exposed port (`POST .../ports`): the daemon listens on `address:hostPort` on the host. */
export interface ExposedPort {
  port: number;
  address: string;
  hostPort: number;
  url: string;
}

export interface ExposePortOptions {
  /** The host port; 0 or absent for a free one. */
  hostPort?: number;
  /** An IPv4 address of the host; default 127.0.0.1. */
  address?: string;
}

export type FileContent = string | Uint8Array | Readable | AsyncIterable<Uint8Array>;

interface SendOptions {
  method: string;
  path: string;
  headers?: Record<string, string>;
  body?: FileContent | undefined;
  signal?: AbortSignal | undefined;
}

function checkOptionalString(options: Record<string, unknown>, name: string): void {
  const value = options[name];
  if (value !== undefined && (typeof value !== 'string' || value === '')) {
    throw new TypeError(`nsbox: option \`${name}\` must be a non-empty string, got ${describe(value)}`);
  }
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') return `${typeof value} ${String(value)}`;
  return typeof value;
}

/** The first 200 characters of an answer that is not nsboxd's, quoted and escaped (JSON). */
function escapedStart(text: string): string {
  const start = JSON.stringify(text.slice(0, 200));
  return text.length > 200 ? `${start}... (${Buffer.byteLength(text)} bytes)` : start;
}

/** An answer's Content-Type for a message, or "no content type". */
function contentTypeOf(res: http.IncomingMessage): string {
  const type = res.headers['content-type'];
  return type ? JSON.stringify(type.slice(0, 100)).slice(1, -1) : 'no content type';
}

const CONNECT_CODES = new Set(['ECONNREFUSED', 'ENOENT', 'EACCES', 'EPERM', 'ENOTSOCK', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT', 'EAI_AGAIN', 'ENOTFOUND']);

/** The nsboxd HTTP API (`api.md`, version 1) over a Unix socket or TCP with a bearer token. */
export class NsboxClient {
  /**
   * The socket requests go to (undefined with `url`). With no `socketPath` given as a normal
   * user, the first of the default sockets until the first request finds the one that answers.
   */
  get socketPath(): string | undefined {
    return this.#sockets[0];
  }
  /** Where requests go, for messages: `unix socket /run/...` or `http://host:port`. */
  get endpoint(): string {
    return this.url !== undefined ? this.url.origin + this.#prefix : `unix socket ${this.#sockets[0]}`;
  }
  /** The socket, or the default sockets in the order they are tried until one answers. */
  #sockets: string[] = [];
  #choosing: Promise<void> | undefined;
  readonly url: URL | undefined;
  readonly #token: string | undefined;
  readonly #agent: http.Agent;
  readonly #prefix: string = '';

  constructor(options: NsboxClientOptions = {}) {
    if (options === null || typeof options !== 'object' || Array.isArray(options)) {
      throw new TypeError(`nsbox: options must be an object, got ${describe(options)}`);
    }
    const opts = options as Record<string, unknown>;
    for (const key of Object.keys(opts)) {
      if (key !== 'socketPath' && key !== 'url' && key !== 'token') {
        throw new TypeError(`nsbox: unknown option \`${key}\` (the client takes socketPath, url and token)`);
      }
    }
    checkOptionalString(opts, 'socketPath');
    checkOptionalString(opts, 'url');
    checkOptionalString(opts, 'token');
    if (options.socketPath !== undefined && options.url !== undefined) {
      throw new TypeError('nsbox: options `socketPath` and `url` exclude each other; give one');
    }
    const urlText = options.socketPath === undefined ? (options.url ?? process.env.NSBOX_URL) : undefined;
    if (urlText) {
      let url: URL;
      try {
        url = new URL(urlText);
      } catch {
        throw new TypeError(`nsbox: option \`url\` is not a URL: ${JSON.stringify(urlText)}`);
      }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') {
        throw new TypeError(`nsbox: option \`url\` must be http:// or https://, got ${JSON.stringify(urlText)}`);
      }
      if (url.username !== '' || url.password !== '') {
        throw new TypeError('nsbox: option `url` must not carry credentials (user:password@); nsboxd takes a bearer token: pass `token`');
      }
      if (url.search !== '' || url.hash !== '') {
        throw new TypeError(`nsbox: option \`url\` must not have a query or a fragment, got ${JSON.stringify(urlText)}`);
      }
      // A path is where nsboxd's API sits behind a reverse proxy: every request goes under it.
      this.#prefix = url.pathname.replace(/\/+$/, '');
      this.url = url;
      this.#token = options.token ?? process.env.NSBOX_TOKEN;
      this.#agent = url.protocol === 'https:' ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true });
    } else {
      if (options.token !== undefined) {
        throw new TypeError('nsbox: option `token` needs `url` (the Unix socket takes no token)');
      }
      this.#sockets = options.socketPath !== undefined ? [options.socketPath] : defaultSocketPaths();
      this.url = undefined;
      this.#token = undefined;
      this.#agent = new http.Agent({ keepAlive: true });
    }
  }

  /** Closes idle keep-alive connections. The client stays usable. */
  close(): void {
    this.#agent.destroy();
  }

  // ---- transport -------------------------------------------------------------------------

  #send(opts: SendOptions, retry = true): Promise<http.IncomingMessage> {
    const { signal } = opts;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    if (this.#sockets.length > 1) {
      return this.#chooseSocket().then(() => {
        if (signal?.aborted) throw abortError(signal);
        return this.#send(opts, retry);
      });
    }
    return new Promise((resolve, reject) => {
      const headers: Record<string, string> = { Host: this.url?.host ?? 'nsboxd', ...opts.headers };
      if (this.#token !== undefined) headers.Authorization = `Bearer ${this.#token}`;
      let body = opts.body;
      if (typeof body === 'string') body = Buffer.from(body, 'utf8');
      if (body instanceof Uint8Array) headers['Content-Length'] = String(body.byteLength);
      else if (body === undefined && opts.method !== 'GET' && opts.method !== 'HEAD') headers['Content-Length'] = '0';

      const requestOptions: http.RequestOptions = {
        method: opts.method,
        path: this.#prefix + opts.path,
        headers,
        agent: this.#agent,
      };
      if (this.socketPath !== undefined) requestOptions.socketPath = this.socketPath;
      else {
        requestOptions.hostname = this.url!.hostname.replace(/^\[|\]$/g, '');
        requestOptions.port = this.url!.port || (this.url!.protocol === 'https:' ? 443 : 80);
      }
      const mod = this.url?.protocol === 'https:' ? https : http;
      const req = mod.request(requestOptions);
      let response: http.IncomingMessage | undefined;
      let done = false;
      const onAbort = () => {
        // Ending the request is the kill: nsboxd kills the command when the client hangs up.
        const err = abortError(signal!);
        req.destroy(err);
        response?.destroy(err);
        if (!done) {
          done = true;
          reject(err);
        }
      };
      const cleanup = () => signal?.removeEventListener('abort', onAbort);
      signal?.addEventListener('abort', onAbort, { once: true });
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (done) return;
        done = true;
        cleanup();
        if (signal?.aborted) return reject(abortError(signal));
        if (retry && req.reusedSocket && err.code === 'ECONNRESET' && !opts.path.endsWith('/exec') && !opts.path.includes('/stdin') && !(body instanceof Readable) && !isAsyncIterable(body)) {
          // A kept-alive connection the daemon had closed: send again on a fresh one (never an exec,
          // which might have started).
          this.#send(opts, false).then(resolve, reject);
          return;
        }
        reject(this.#transportError(err, response !== undefined));
      });
      req.on('response', (res) => {
        response = res;
        if (done) return;
        done = true;
        res.once('close', cleanup);
        resolve(res);
      });
      if (body === undefined) req.end();
      else if (body instanceof Uint8Array) req.end(body);
      else {
        const source = body instanceof Readable ? body : Readable.from(body);
        source.on('error', (err) => req.destroy(err));
        source.pipe(req);
      }
    });
  }

  /**
   * The default sockets (no `socketPath`, `url`, NSBOX_SOCKET or NSBOX_URL, as a normal user):
   * the first that accepts a connection is the client's socket for good, as the CLI does. When
   * none does, `daemon_unreachable` says of each why, and the next request tries them again.
   */
  #chooseSocket(): Promise<void> {
    this.#choosing ??= firstAnswering(this.#sockets).then(
      ({ socket, failures }) => {
        this.#choosing = undefined;
        if (socket === undefined) throw new NsboxError('daemon_unreachable', noDaemonMessage(failures));
        this.#sockets = [socket];
      },
      (err: unknown) => {
        this.#choosing = undefined;
        throw err;
      },
    );
    return this.#choosing;
  }

  #transportError(err: NodeJS.ErrnoException, answered: boolean): NsboxError {
    if (err instanceof NsboxError) return err;
    if (!answered && err.code && CONNECT_CODES.has(err.code)) {
      const hint =
        this.socketPath === undefined
          ? 'is nsboxd listening there with --listen?'
          : err.code === 'EACCES' || err.code === 'EPERM'
            ? accessHint(this.socketPath)
            : 'is nsboxd running? (`nsbox serve`; or pass `socketPath`, or set NSBOX_SOCKET)';
      return new NsboxError(
        'daemon_unreachable',
        `nsbox: cannot reach nsboxd at ${this.endpoint}: ${err.code} (${err.message}); ${hint}`,
        { cause: err },
      );
    }
    return new NsboxError(
      'connection_lost',
      `nsbox: connection to nsboxd at ${this.endpoint} failed: ${err.code ?? ''} ${err.message}`.replace(/  +/g, ' '),
      { cause: err },
    );
  }

  async #readAll(res: http.IncomingMessage): Promise<Buffer> {
    const chunks: Buffer[] = [];
    try {
      for await (const chunk of res) chunks.push(chunk as Buffer);
    } catch (err) {
      if (err instanceof DOMException || err instanceof NsboxError) throw err;
      throw this.#transportError(err as NodeJS.ErrnoException, true);
    }
    // A buffer of its own, never a slice of Node's shared pool (Buffer.concat takes small ones
    // from it): its `.buffer` would show other bytes of this process, such as an exec's env.
    let total = 0;
    for (const chunk of chunks) total += chunk.length;
    const out = Buffer.allocUnsafeSlow(total);
    let at = 0;
    for (const chunk of chunks) at += chunk.copy(out, at);
    return out;
  }

  async #errorFrom(res: http.IncomingMessage, verb?: string): Promise<NsboxError> {
    const text = (await this.#readAll(res)).toString('utf8');
    const status = res.statusCode ?? 0;
    let parsed: { error?: { code?: string; message?: string; path?: string; syscall?: string } } | undefined;
    try {
      parsed = JSON.parse(text);
    } catch {
      /* not JSON */
    }
    const e = parsed?.error;
    if (e && typeof e.code === 'string') {
      let code = e.code;
      // Node names rm's "is a directory" refusal ERR_FS_EISDIR; mimic it.
      if (verb === 'rm' && code === 'EISDIR') code = 'ERR_FS_EISDIR';
      return new NsboxError(code, e.message ?? `${code} (HTTP ${status})`, {
        status,
        ...(e.path !== undefined ? { path: e.path } : {}),
        ...(e.syscall !== undefined ? { syscall: e.syscall } : {}),
      });
    }
    // Not nsboxd's error body (a proxy's or another server's page): its status, its type and
    // the start of it, escaped, so that a whole HTML page never becomes the message.
    return new NsboxError('invalid_answer', `nsbox: ${this.endpoint} answered HTTP ${status} (${contentTypeOf(res)}) without an nsboxd error; is it nsboxd? It began: ${escapedStart(text)}`, { status });
  }

  #parse(body: Buffer, status: number): unknown {
    try {
      return JSON.parse(body.toString('utf8'));
    } catch {
      throw new NsboxError(
        'invalid_answer',
        `nsbox: the answer of ${this.endpoint} (HTTP ${status}) is not JSON; is it nsboxd? It began: ${escapedStart(body.toString('utf8'))}`,
        { status },
      );
    }
  }

  async #request(opts: SendOptions & { verb?: string }): Promise<{ status: number; body: Buffer }> {
    const res = await this.#send(opts);
    if ((res.statusCode ?? 0) >= 400) throw await this.#errorFrom(res, opts.verb);
    return { status: res.statusCode ?? 0, body: await this.#readAll(res) };
  }

  async #json<T>(method: string, path: string, payload?: unknown, verb?: string, signal?: AbortSignal): Promise<T> {
    const opts: SendOptions & { verb?: string } = { method, path, signal };
    if (verb !== undefined) opts.verb = verb;
    if (payload !== undefined) {
      opts.body = Buffer.from(JSON.stringify(payload), 'utf8');
      opts.headers = { 'Content-Type': 'application/json' };
    }
    const { body, status } = await this.#request(opts);
    if (body.length === 0) return undefined as T;
    return this.#parse(body, status) as T;
  }

  // ---- service ---------------------------------------------------------------------------

  /** `GET /v1/health`. */
  health(): Promise<HealthResult> {
    return this.#json('GET', '/v1/health');
  }

  /** `GET /metrics`: Prometheus text. */
  async metrics(): Promise<string> {
    const { body } = await this.#request({ method: 'GET', path: '/metrics' });
    return body.toString('utf8');
  }

  // ---- sandboxes -------------------------------------------------------------------------

  /** `PUT /v1/sandboxes/{id}`: find-or-create. Options apply only at creation. */
  async putSandbox(id: string, options?: SandboxCreateOptions): Promise<SandboxPutResult> {
    const opts: SendOptions = { method: 'PUT', path: sandboxUrl(id) };
    if (options !== undefined) {
      opts.body = Buffer.from(JSON.stringify(options), 'utf8');
      opts.headers = { 'Content-Type': 'application/json' };
    }
    const { status, body } = await this.#request(opts);
    return { ...(this.#parse(body, status) as SandboxInfo), created: status === 201 };
  }

  /** `GET /v1/sandboxes/{id}`; `sandbox_not_found` if there is none. */
  async getSandbox(id: string): Promise<SandboxInfo> {
    return this.#json('GET', sandboxUrl(id));
  }

  /** `GET /v1/sandboxes`. */
  async listSandboxes(): Promise<SandboxInfo[]> {
    return (await this.#json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/sandboxes')).sandboxes;
  }

  /** `POST /v1/sandboxes/{id}/stop`: ends every process; the files stay. */
  async stopSandbox(id: string): Promise<SandboxInfo> {
    return this.#json('POST', `${sandboxUrl(id)}/stop`);
  }

  /** `GET /v1/sandboxes/{id}/network`: the policy in force, and the address while it runs. */
  async getNetwork(id: string): Promise<{ network: NetworkPolicy; address: string | null }> {
    return this.#json('GET', `${sandboxUrl(id)}/network`);
  }

  /**
   * `PUT /v1/sandboxes/{id}/network`: replaces the policy, on a running sandbox at once for new
   * connections. `network_unavailable` (422) when the host cannot enforce it.
   */
  async setNetwork(id: string, network: NetworkPolicy): Promise<SandboxInfo> {
    return this.#json('PUT', `${sandboxUrl(id)}/network`, { network });
  }

  /** `DELETE /v1/sandboxes/{id}`: ends every process and deletes all its data. */
  async deleteSandbox(id: string): Promise<void> {
    await this.#request({ method: 'DELETE', path: sandboxUrl(id) });
  }

  // ---- exec ------------------------------------------------------------------------------

  /** `POST .../exec`, buffered: resolves when the command has ended, whatever its exit code. */
  async exec(id: string, command: string, options: ExecOptions = {}): Promise<ExecResult> {
    return this.#json<ExecResult>('POST', `${sandboxUrl(id)}/exec`, execBody(command, options), undefined, options.signal);
  }

  /**
   * `POST .../exec` with `Accept: application/x-ndjson`: the events as they come. Leaving the
   * loop early (`break`, a throw) or aborting `options.signal` hangs up, which kills the command.
   */
  async *execStream(id: string, command: string, options: ExecOptions = {}): AsyncGenerator<ExecEvent, void, undefined> {
    const res = await this.#send({
      method: 'POST',
      path: `${sandboxUrl(id)}/exec`,
      headers: { 'Content-Type': 'application/json', Accept: 'application/x-ndjson' },
      body: Buffer.from(JSON.stringify(execBody(command, options)), 'utf8'),
      signal: options.signal,
    });
    yield* this.#events(res, true);
  }

  /**
   * `GET .../execs/{execId}/output`: re-attach to a running or recently ended exec. The kept
   * output from `offset` on, then (with `follow`) the live output, and the exit event (also when
   * the exec had already ended; without `follow` only if it has). Errors: `exec_not_found` (404),
   * `offset_not_retained` (410, the message names the oldest kept offset).
   */
  async *attachOutput(id: string, execId: string, options: AttachOptions = {}): AsyncGenerator<ExecEvent, void, undefined> {
    const query = new URLSearchParams();
    if (options.offset !== undefined) query.set('offset', String(options.offset));
    if (options.follow) query.set('follow', '1');
    if (options.encoding !== undefined) query.set('encoding', options.encoding);
    const q = query.toString();
    const res = await this.#send({
      method: 'GET',
      path: `${sandboxUrl(id)}/execs/${encodeURIComponent(execId)}/output${q ? `?${q}` : ''}`,
      signal: options.signal,
    });
    yield* this.#events(res, options.follow === true);
  }

  async *#events(res: http.IncomingMessage, needExit: boolean): AsyncGenerator<ExecEvent, void, undefined> {
    if ((res.statusCode ?? 0) >= 400) throw await this.#errorFrom(res);
    let finished = false;
    try {
      res.setEncoding('utf8');
      let pending = '';
      try {
        for await (const chunk of res) {
          pending += chunk as string;
          let nl: number;
          while ((nl = pending.indexOf('\n')) >= 0) {
            const line = pending.slice(0, nl);
            pending = pending.slice(nl + 1);
            if (line.trim() === '') continue;
            const event = JSON.parse(line) as ExecEvent;
            if (event.type === 'exit') finished = true;
            yield event;
          }
        }
      } catch (err) {
        if (err instanceof DOMException || err instanceof NsboxError) throw err;
        throw this.#transportError(err as NodeJS.ErrnoException, true);
      }
      if (pending.trim() !== '') {
        const event = JSON.parse(pending) as ExecEvent;
        if (event.type === 'exit') finished = true;
        yield event;
      }
      if (!finished && needExit) {
        throw new NsboxError('connection_lost', `nsbox: the exec stream from ${this.endpoint} ended without an exit event`);
      }
    } finally {
      // Leaving before the end: hang up (which kills the command only for the request that started it).
      if (!res.complete) res.destroy();
    }
  }

  /**
   * `POST .../execs/{execId}/stdin[?close=1]`: writes `data` to the stdin of an exec started with
   * `stdinStream` or `tty`; `close` then closes it (EOF). Errors: `stdin_not_streamed`,
   * `stdin_closed`, `exec_ended` (409), `exec_not_found` (404).
   */
  async sendStdin(id: string, execId: string, data: FileContent, options: { close?: boolean; signal?: AbortSignal } = {}): Promise<void> {
    await this.#request({
      method: 'POST',
      path: `${sandboxUrl(id)}/execs/${encodeURIComponent(execId)}/stdin${options.close ? '?close=1' : ''}`,
      headers: { 'Content-Type': 'application/octet-stream' },
      body: data,
      signal: options.signal,
    });
  }

  /** `POST .../execs/{execId}/resize`: a terminal exec's new size (`not_a_terminal` otherwise). */
  async resizeExec(id: string, execId: string, rows: number, cols: number): Promise<void> {
    await this.#request({
      method: 'POST',
      path: `${sandboxUrl(id)}/execs/${encodeURIComponent(execId)}/resize`,
      headers: { 'Content-Type': 'application/json' },
      body: Buffer.from(JSON.stringify({ rows, cols }), 'utf8'),
    });
  }

  /** `DELETE .../execs/{execId}`: kills a running command (its stream ends with `cancelled: true`). */
  async cancelExec(id: string, execId: string): Promise<void> {
    await this.#request({ method: 'DELETE', path: `${sandboxUrl(id)}/execs/${encodeURIComponent(execId)}` });
  }

  /** `GET .../execs`: the commands running now; with `all`, also the ended ones kept for re-attach. */
  async listExecs(id: string, options: { all?: boolean } = {}): Promise<RunningExec[]> {
    const answer = await this.#json<{ execs: RunningExec[] } | RunningExec[]>('GET', `${sandboxUrl(id)}/execs${options.all ? '?all=1' : ''}`);
    return Array.isArray(answer) ? answer : answer.execs;
  }

  // ---- ports -----------------------------------------------------------------------------

  /**
   * `POST .../ports`: listen on the host for `port` inside (127.0.0.1 in the sandbox); each
   * connection is relayed byte for byte. `port_already_exposed`, `address_in_use` on conflicts.
   */
  async exposePort(id: string, port: number, options: ExposePortOptions = {}): Promise<ExposedPort> {
    return this.#json('POST', `${sandboxUrl(id)}/ports`, { port, ...options });
  }

  /** `GET .../ports`, sorted by port. */
  async listPorts(id: string): Promise<ExposedPort[]> {
    return (await this.#json<{ ports: ExposedPort[] }>('GET', `${sandboxUrl(id)}/ports`)).ports;
  }

  /** `DELETE .../ports/{port}`: closes the listener and its connections. */
  async closePort(id: string, port: number): Promise<void> {
    await this.#request({ method: 'DELETE', path: `${sandboxUrl(id)}/ports/${port}` });
  }

  // ---- files -----------------------------------------------------------------------------

  /** `GET .../files?path=P`: the file's bytes. */
  async readFile(id: string, path: SandboxPath, options: { signal?: AbortSignal } = {}): Promise<Buffer> {
    const { body } = await this.#request({ method: 'GET', path: filesUrl(id, path), signal: options.signal });
    return body;
  }

  /** `GET .../files?path=P` as a stream; errors (ENOENT, EISDIR, ...) reject before any byte. */
  async readFileStream(id: string, path: SandboxPath, options: { signal?: AbortSignal } = {}): Promise<Readable> {
    const res = await this.#send({ method: 'GET', path: filesUrl(id, path), signal: options.signal });
    if ((res.statusCode ?? 0) >= 400) throw await this.#errorFrom(res);
    return res;
  }

  /**
   * `PUT .../files?path=P`: creates or atomically replaces the file, making missing parents.
   * `content` is a string (UTF-8), bytes, or a stream / async iterable of bytes. `mode`: the
   * file's permission bits (`0o755`); without it an existing file keeps its mode, a new one 0644.
   */
  async writeFile(id: string, path: SandboxPath, content: FileContent, options: { signal?: AbortSignal; mode?: number } = {}): Promise<void> {
    let url = filesUrl(id, path);
    if (options.mode !== undefined) {
      if (!Number.isInteger(options.mode) || options.mode < 0 || options.mode > 0o7777) {
        throw new TypeError(`nsbox: writeFile's mode must be permission bits from 0 to 0o7777, got ${describe(options.mode)}`);
      }
      url += `&mode=${options.mode.toString(8)}`;
    }
    checkContent(content);
    await this.#request({
      method: 'PUT',
      path: url,
      headers: { 'Content-Type': 'application/octet-stream' },
      body: content,
      signal: options.signal,
    });
  }

  /** `POST .../fs/stat`: target's kind, size and mtime; `isSymbolicLink` of the path itself. */
  async stat(id: string, path: SandboxPath): Promise<StatResult> {
    return this.#json('POST', `${sandboxUrl(id)}/fs/stat`, pathBody(path));
  }

  /** `POST .../fs/readdir`: names sorted by byte value, or typed entries with `withTypes`. */
  readdir(id: string, path: SandboxPath): Promise<string[]>;
  readdir(id: string, path: SandboxPath, options: { withTypes: true }): Promise<DirEntry[]>;
  readdir(id: string, path: SandboxPath, options?: { withTypes?: boolean }): Promise<string[] | DirEntry[]>;
  async readdir(id: string, path: SandboxPath, options: { withTypes?: boolean } = {}): Promise<string[] | DirEntry[]> {
    const body: Record<string, unknown> = pathBody(path);
    if (options.withTypes) body.withTypes = true;
    return (await this.#json<{ entries: string[] | DirEntry[] }>('POST', `${sandboxUrl(id)}/fs/readdir`, body)).entries;
  }

  /** `POST .../fs/exists`: never an error for the path itself (only for the daemon or the sandbox). */
  async exists(id: string, path: SandboxPath): Promise<boolean> {
    return (await this.#json<{ exists: boolean }>('POST', `${sandboxUrl(id)}/fs/exists`, pathBody(path))).exists;
  }

  /** `POST .../fs/mkdir`: exactly Node's `fs.mkdir`. */
  async mkdir(id: string, path: SandboxPath, options: { recursive?: boolean } = {}): Promise<void> {
    await this.#json('POST', `${sandboxUrl(id)}/fs/mkdir`, { ...pathBody(path), recursive: options.recursive ?? false });
  }

  /** `POST .../fs/rm`: exactly Node's `fs.rm` (a directory without `recursive` is `ERR_FS_EISDIR`). */
  async rm(id: string, path: SandboxPath, options: { recursive?: boolean; force?: boolean } = {}): Promise<void> {
    await this.#json(
      'POST',
      `${sandboxUrl(id)}/fs/rm`,
      { ...pathBody(path), recursive: options.recursive ?? false, force: options.force ?? false },
      'rm',
    );
  }
}

function checkContent(content: unknown): void {
  if (typeof content === 'string' || content instanceof Uint8Array || content instanceof Readable || isAsyncIterable(content)) return;
  throw new TypeError(
    `nsbox: writeFile's content must be a string, a Uint8Array (a Buffer), a Readable or an async iterable of bytes, got ${describe(content)}`,
  );
}

function isAsyncIterable(value: unknown): value is AsyncIterable<Uint8Array> {
  return value !== null && typeof value === 'object' && Symbol.asyncIterator in (value as object);
}

function sandboxUrl(id: string): string {
  if (typeof id !== 'string' || id === '') throw new TypeError('nsbox: a sandbox id must be a non-empty string');
  return `/v1/sandboxes/${encodeURIComponent(id)}`;
}

function pathBody(path: SandboxPath): Record<string, unknown> {
  if (typeof path === 'string') return { path };
  if (path instanceof Uint8Array) return { pathBase64: Buffer.from(path.buffer, path.byteOffset, path.byteLength).toString('base64') };
  throw new TypeError(`nsbox: a path must be a string or a Uint8Array, got ${describe(path)}`);
}

function filesUrl(id: string, path: SandboxPath): string {
  const body = pathBody(path);
  const query = typeof body.path === 'string' ? `path=${encodeURIComponent(body.path)}` : `pathBase64=${encodeURIComponent(body.pathBase64 as string)}`;
  return `${sandboxUrl(id)}/files?${query}`;
}

function execBody(command: string, options: ExecOptions): Record<string, unknown> {
  if (typeof command !== 'string') throw new TypeError(`nsbox: exec's command must be a string, got ${describe(command)}`);
  const body: Record<string, unknown> = { command };
  if (options.cwd !== undefined) body.cwd = options.cwd;
  if (options.env !== undefined) {
    if (options.env === null || typeof options.env !== 'object' || Array.isArray(options.env)) {
      throw new TypeError(`nsbox: exec's env must be an object, got ${describe(options.env)}`);
    }
    // A variable set to undefined is left out of the command's environment, as Node's
    // child_process leaves it out: null unsets it over the sandbox's base (JSON drops undefined).
    const env: Record<string, string | null> = {};
    for (const [name, value] of Object.entries(options.env)) env[name] = value === undefined ? null : value;
    body.env = env;
  }
  if (options.timeoutMs !== undefined) {
    const t = options.timeoutMs;
    if (typeof t !== 'number' || !Number.isInteger(t) || t < 0) {
      throw new RangeError(`nsbox: exec's timeoutMs must be a whole number of milliseconds >= 0 (0: none), got ${describe(t)}`);
    }
    body.timeoutMs = t;
  }
  if (options.stdin !== undefined) body.stdin = options.stdin;
  if (options.encoding !== undefined) body.encoding = options.encoding;
  if (options.detach !== undefined) body.detach = options.detach;
  if (options.stdinStream !== undefined) body.stdinStream = options.stdinStream;
  if (options.tty !== undefined) body.tty = options.tty;
  return body;
}
