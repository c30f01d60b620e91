import { constants } from 'node:os';

/** An error answered by nsboxd, or a failure to reach it. */
export class NsboxError extends Error {
  /**
   * The API's code: an errno name for file-system errors (`ENOENT`, `EEXIST`, ...;
   * `ERR_FS_EISDIR` for `rm` of a directory, as Node names it), a snake_case word for API
   * errors (`sandbox_not_found`, `unauthorized`, ...), or `daemon_unreachable` when the
   * daemon could not be reached at all.
   */
  readonly code: string;
  /** HTTP status of the answer (0 when there was no answer). */
  readonly status: number;
  /** The path the error is about, for file-system errors (absent otherwise, as on Node's errors). */
  declare readonly path?: string;
  /** The system call that failed, for file-system errors. */
  declare readonly syscall?: string;
  /** For an errno `code`, Node's negative number of it (`-2` for `ENOENT`), as on Node's errors. */
  declare readonly errno?: number;

  constructor(
    code: string,
    message: string,
    init: { status?: number; path?: string; syscall?: string; cause?: unknown } = {},
  ) {
    super(message, init.cause !== undefined ? { cause: init.cause } : undefined);
    this.name = 'NsboxError';
    this.code = code;
    this.status = init.status ?? 0;
    if (init.path !== undefined) this.path = init.path;
    if (init.syscall !== undefined) this.syscall = init.syscall;
    const errno = (constants.errno as Record<string, number | undefined>)[code];
    if (errno !== undefined) this.errno = -errno;
  }
}

/** An `AbortError` `DOMException` carrying the signal's reason as `cause`. */
export function abortError(signal: AbortSignal): DOMException {
  const reason: unknown = signal.reason;
  const message =
    reason instanceof Error && reason.message
      ? reason.message
      : typeof reason === 'string' && reason
        ? reason
        : 'The operation was aborted.';
  const error = new DOMException(message, 'AbortError');
  try {
    Object.defineProperty(error, 'cause', { value: reason, configurable: true });
  } catch {
    /* ignore */
  }
  return error;
}
