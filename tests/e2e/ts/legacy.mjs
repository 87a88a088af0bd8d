// The 2025-11-25 task client of @modelcontextprotocol/sdk 1.32.2 against the hub's legacy
// door (`/legacy/mcp`, the hub in front of the fleet's alpha server).
//
//   node legacy.mjs <legacy-mcp-url>
//
// Steps, with the SDK's experimental tasks API (client.experimental.tasks):
//   1. connect (initialize at 2025-11-25, declaring the legacy tasks and elicitation
//      capabilities);
//   2. callToolStream `slow_report` with a task: taskCreated, taskStatus…, result;
//   3. callToolStream `deploy` with a task: it asks for confirmation; the SDK calls
//      tasks/result, the elicitation arrives on that stream, this client accepts it, and
//      the result follows;
//   4. a second `deploy` task, created with tools/call and cancelled with cancelTask;
//   5. getTask of each, and listTasks (every page).
// stdout: one JSON object per line ({"kind": …}); exit 0 after {"kind":"done"}.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CallToolResultSchema,
  CreateTaskResultSchema,
  ElicitRequestSchema,
} from '@modelcontextprotocol/sdk/types.js';

const emit = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);
const url = process.argv[2];
if (!url) {
  process.stderr.write('usage: node legacy.mjs <legacy-mcp-url>\n');
  process.exit(2);
}

const client = new Client(
  { name: 'taskhub-legacy-e2e', version: '1.0.0' },
  {
    capabilities: {
      elicitation: { form: {} },
      tasks: { list: {}, cancel: {}, requests: { elicitation: { create: {} } } },
    },
  },
);
const elicited = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  elicited.push(request.params);
  return { action: 'accept', content: { confirm: true } };
});

async function follow(name, args) {
  const messages = [];
  const stream = client.experimental.tasks.callToolStream(
    { name, arguments: args },
    CallToolResultSchema,
    { task: { ttl: 60_000 } },
  );
  for await (const message of stream) {
    messages.push(message.type);
    if (message.type === 'taskCreated') emit({ kind: 'created', tool: name, task: message.task });
    if (message.type === 'taskStatus') emit({ kind: 'status', tool: name, task: message.task });
    if (message.type === 'result') emit({ kind: 'result', tool: name, result: message.result });
    if (message.type === 'error') emit({ kind: 'error', tool: name, message: String(message.error) });
  }
  return messages;
}

const timer = setTimeout(() => {
  process.stderr.write('timed out\n');
  process.exit(3);
}, 30_000);
try {
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  emit({
    kind: 'connected',
    protocolVersion: transport.protocolVersion ?? null,
    sessionId: transport.sessionId ?? null,
    capabilities: client.getServerCapabilities(),
  });
  await follow('slow_report', { steps: 2, step_seconds: 0.05 });
  await follow('deploy', { service: 'api' });
  emit({ kind: 'elicited', requests: elicited });

  const created = await client.request(
    { method: 'tools/call', params: { name: 'deploy', arguments: { service: 'web' }, task: {} } },
    CreateTaskResultSchema,
  );
  const cancelled = await client.experimental.tasks.cancelTask(created.task.taskId);
  emit({ kind: 'cancelled', task: cancelled });
  const got = await client.experimental.tasks.getTask(created.task.taskId);
  emit({ kind: 'get', task: got });

  const listed = [];
  let cursor;
  do {
    const page = await client.experimental.tasks.listTasks(cursor);
    listed.push(...page.tasks);
    cursor = page.nextCursor;
  } while (cursor);
  emit({ kind: 'list', tasks: listed });
  await transport.terminateSession();
  await client.close();
  emit({ kind: 'done' });
  clearTimeout(timer);
} catch (error) {
  process.stderr.write(`${error?.stack ?? error}\n`);
  process.exit(1);
}
