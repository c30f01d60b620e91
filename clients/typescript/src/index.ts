export { NsboxClient } from './client.js';
export { defaultSocketPath, defaultSocketPaths } from './sockets.js';
export type {
  NsboxClientOptions,
  SandboxLimits,
  NetworkPolicy,
  SandboxCreateOptions,
  SandboxInfo,
  SandboxPutResult,
  SandboxPath,
  ExecOptions,
  AttachOptions,
  ExecReason,
  ExecResult,
  ExecUsage,
  ExecEvent,
  RunningExec,
  StatResult,
  DirEntry,
  HealthResult,
  FileContent,
  ExposedPort,
  ExposePortOptions,
} from './client.js';
export { NsboxError } from './errors.js';
