// Drives the real @modelcontextprotocol/client against the taskhub (protocol 2026-07-28).
//
//   node listen.mjs <mcp-endpoint-url> <task-id> [--timeout-ms N] [--trace]
//
// Steps: connect pinned to 2026-07-28 (the connect probe is `server/discover`), declare the
// tasks extension, call `server/discover` again explicitly, `tasks/get` the task, then
// `listen({taskIds: [id]})` and print every `notifications/tasks` until a terminal status.
//
// stdout: one JSON object per line, in this order:
//   {"kind":"connected","protocolVersion":…,"era":…,"serverVersion":…}
//   {"kind":"discover","result":…}
//   {"kind":"get","result":…}                 (resultType already consumed by the client)
//   {"kind":"ack","honoredFilter":…,"wire":…}  (wire = the ack params as received)
//   {"kind":"notification","method":"notifications/tasks","params":…}   (one per frame)
// Exit 0 once a terminal status (completed/failed/cancelled) has been printed; otherwise a
// message on stderr and a non-zero exit (1 = error, 2 = usage, 3 = timeout).
// --trace writes every HTTP request and response message the transport exchanges to stderr.

import { StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

import {
  DetailedTaskResult,
  PROTOCOL,
  TASKS_EXT,
  TaskNotificationParams,
  TERMINAL,
  emit,
  tracingFetch,
  tasksClient,
} from './common.mjs';

function usage(message) {
  process.stderr.write(`${message}\nusage: node listen.mjs <mcp-url> <task-id> [--timeout-ms N] [--trace]\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const positional = [];
  let timeoutMs = 20_000;
  let trace = false;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--trace') trace = true;
    else if (argv[i] === '--timeout-ms') timeoutMs = Number(argv[++i]);
    else positional.push(argv[i]);
  }
  if (positional.length !== 2) usage('expected <mcp-url> and <task-id>');
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) usage('bad --timeout-ms');
  return { url: new URL(positional[0]), taskId: positional[1], timeoutMs, trace };
}

async function main() {
  const { url, taskId, timeoutMs, trace } = parseArgs(process.argv.slice(2));
  const timer = setTimeout(() => {
    process.stderr.write(`timeout: no terminal notifications/tasks for ${taskId} within ${timeoutMs} ms\n`);
    process.exit(3);
  }, timeoutMs);

  const client = tasksClient('taskhub-ts-e2e');

  let finished;
  const terminal = new Promise((resolve) => (finished = resolve));
  // Frames that the client dispatches before listen() has resolved with the ack are held back,
  // so stdout always reads ack-then-notifications (--trace shows the true wire order).
  let held = [];
  const report = (params) => {
    emit({ kind: 'notification', method: 'notifications/tasks', params });
    if (params.taskId === taskId && TERMINAL.has(params.status)) finished();
  };
  // notifications/tasks is an extension notification: registered with an explicit schema.
  client.setNotificationHandler('notifications/tasks', { params: TaskNotificationParams }, (params) => {
    if (held) held.push(params);
    else report(params);
  });

  const transport = new StreamableHTTPClientTransport(url, { fetch: tracingFetch(trace) });
  await client.connect(transport, { timeout: timeoutMs });
  // client.listen() resolves with `honoredFilter` re-parsed by the client's own schema, which
  // (2.4.0) knows no `taskIds` and strips it. Keep the ack exactly as the transport delivered it
  // too, by chaining the transport's public `onmessage` callback that the client installed.
  let wireAck;
  const deliver = transport.onmessage;
  transport.onmessage = (message, extra) => {
    if (message?.method === 'notifications/subscriptions/acknowledged') wireAck = message.params;
    deliver?.(message, extra);
  };
  emit({
    kind: 'connected',
    protocolVersion: client.getNegotiatedProtocolVersion(),
    era: client.getProtocolEra(),
    serverVersion: client.getServerVersion() ?? null,
  });

  emit({ kind: 'discover', result: await client.discover({ timeout: timeoutMs }) });

  // The client has no tasks/get method of its own on the 2026 era; this is its generic request
  // API, which exempts the extension's tasks/get from the era gate and sends Mcp-Name: <taskId>.
  const got = await client.request({ method: 'tasks/get', params: { taskId } }, DetailedTaskResult, { timeout: timeoutMs });
  emit({ kind: 'get', result: got });

  const subscription = await client.listen({ taskIds: [taskId] }, { timeout: timeoutMs });
  emit({ kind: 'ack', honoredFilter: subscription.honoredFilter, wire: wireAck ?? null });
  const early = held;
  held = undefined;
  early.forEach(report);
  const ended = subscription.closed.then((cause) => cause);

  const outcome = await Promise.race([terminal.then(() => 'terminal'), ended]);
  if (outcome !== 'terminal') throw new Error(`subscription closed (${outcome}) before a terminal status`);
  clearTimeout(timer);
  await subscription.close();
  await client.close();
  process.exit(0);
}

main().catch((error) => {
  process.stderr.write(`error: ${error?.stack ?? error}\n`);
  if (error?.data !== undefined) process.stderr.write(`error data: ${JSON.stringify(error.data)}\n`);
  process.exit(1);
});
