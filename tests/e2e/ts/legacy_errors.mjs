// The errors of the hub's legacy door as the 2025-11-25 client of @modelcontextprotocol/sdk
// 1.32.2 sees them: each an McpError carrying the JSON-RPC code, as from an SDK server.
//
//   node legacy_errors.mjs <legacy-mcp-url>
//
// Steps: connect; a `slow_report` task followed until completed; then, each expected to
// fail, cancelTask of that completed task, getTask and getTaskResult of an unknown task,
// and a method the hub does not serve.
// stdout: one JSON object per line ({"kind": …}); exit 0 after {"kind":"done"}.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CallToolResultSchema,
  CreateTaskResultSchema,
  EmptyResultSchema,
  McpError,
} from '@modelcontextprotocol/sdk/types.js';

const emit = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);
const url = process.argv[2];
if (!url) {
  process.stderr.write('usage: node legacy_errors.mjs <legacy-mcp-url>\n');
  process.exit(2);
}

async function refused(kind, call) {
  try {
    const result = await call();
    emit({ kind, result });
  } catch (error) {
    emit({
      kind,
      mcpError: error instanceof McpError,
      name: error?.name ?? null,
      code: error?.code ?? null,
      message: String(error?.message ?? error),
    });
  }
}

const timer = setTimeout(() => {
  process.stderr.write('timed out\n');
  process.exit(3);
}, 30_000);
try {
  const client = new Client(
    { name: 'taskhub-legacy-errors', version: '1.0.0' },
    { capabilities: { tasks: { list: {}, cancel: {} } } },
  );
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  const tasks = client.experimental.tasks;

  const created = await client.request(
    {
      method: 'tools/call',
      params: { name: 'slow_report', arguments: { steps: 1, step_seconds: 0 }, task: {} },
    },
    CreateTaskResultSchema,
  );
  const taskId = created.task.taskId;
  let task = await tasks.getTask(taskId);
  while (task.status !== 'completed') {
    await new Promise((resolve) => setTimeout(resolve, 50));
    task = await tasks.getTask(taskId);
  }
  emit({ kind: 'completed', taskId });

  const unknown = 'no-such-task-0000';
  await refused('cancel completed', () => tasks.cancelTask(taskId));
  await refused('get unknown', () => tasks.getTask(unknown));
  await refused('result unknown', () => tasks.getTaskResult(unknown, CallToolResultSchema));
  await refused('unknown method', () => client.request({ method: 'hub/nothing' }, EmptyResultSchema));

  await transport.terminateSession();
  await client.close();
  emit({ kind: 'done' });
  clearTimeout(timer);
} catch (error) {
  process.stderr.write(`${error?.stack ?? error}\n`);
  process.exit(1);
}
