export { NsboxClient, defaultSocketPath } from './client.js';
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
