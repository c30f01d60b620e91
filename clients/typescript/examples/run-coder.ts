// Runs the agent from a plain script (no server): node --experimental-strip-types, tsx, or compiled.
import { init } from '@flue/runtime';
import { start } from '@flue/runtime/node';
import { Coder } from './coder.js';

await using flue = await start({ agents: [Coder] }); // in-memory sqlite; pi's built-in providers
void flue;
const agent = init(Coder, { id: 'demo-1' });
const receipt = await agent.dispatch('Write fizzbuzz.py in /workspace, run it for 1..15, and show the output.');
const reply = await agent.read(receipt);
console.log(reply.text);
