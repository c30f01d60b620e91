// A complete Flue agent whose files and shell live in an nsbox sandbox.
// Same as `useSandbox(local())`, with isolation: one persistent sandbox per agent instance id.
'use agent';
import { useModel, useSandbox } from '@flue/runtime';
import { nsbox } from 'nsbox/flue';

export function Coder({ id }: { id: string }) {
  useModel('anthropic/claude-sonnet-4-6');
  useSandbox(
    nsbox({
      // socketPath: '/run/nsbox/nsboxd.sock',            // the default as root
      // url: 'http://127.0.0.1:7711', token: process.env.NSBOX_TOKEN, // or TCP
      idPrefix: 'coder-', // sandbox "coder-<id>": the conversation keeps its /workspace
      limits: { memoryBytes: 2 * 1024 ** 3, pids: 512 },
      env: { CI: '1' },
    }),
  );
  return `You are a coding agent working on conversation ${id}. Your workspace is /workspace.
Use the tools to read, write and run code there; run the tests before you answer.`;
}
