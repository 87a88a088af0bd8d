// A whole client flow with the real @modelcontextprotocol/client against one MCP URL
// (protocol 2026-07-28): a fleet server by itself, or the hub in front of one.
//
//   node flow.mjs <mcp-endpoint-url> <tool-name> [--args JSON] [--timeout-ms N] [--trace]
//
// Steps: connect pinned to 2026-07-28 declaring the tasks extension (the connect probe is
// `server/discover`), `server/discover` again explicitly, `tools/list`, `tools/call` of the
// tool (which must answer with a task), then `listen({taskIds: [id]})`. Where the URL grants
// the task in its ack, the task is followed by its `notifications/tasks` to a terminal status;
// where it does not (a bare fleet server declines task subscriptions: the ack has no
// `taskIds`), the subscription is closed and the task is polled with `tasks/get` at the same
// URL, at the task's pollIntervalMs, until it is terminal.
//
// stdout: one JSON object per line, in this order:
//   {"kind":"connected","protocolVersion":…,"era":…,"serverVersion":…,"serverCapabilities":…}
//   {"kind":"discover","result":…}
//   {"kind":"tools","tools":[…]}
//   {"kind":"created","wire":…,"clientError":{"code":…,"message":…,"data":…}|null}
//   {"kind":"ack","granted":true|false,"wire":…}      (wire = the ack params as received)
//   then either {"kind":"notification","params":…} per frame (granted)
//   or          {"kind":"poll","result":…} per tasks/get whose answer changed (not granted)
//   {"kind":"final","task":…}                          (the terminal state, as last received)
// Exit 0 after the final line; otherwise a message on stderr and a non-zero exit (1 = error,
// 2 = usage, 3 = timeout, 4 = the tool call did not answer with a task).
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
const ACK = 'notifications/subscriptions/acknowledged';

function usage(message) {
  process.stderr.write(
    `${message}\nusage: node flow.mjs <mcp-url> <tool> [--args JSON] [--timeout-ms N] [--trace]\n`,
  );
  process.exit(2);
}

function parseArgs(argv) {
  const positional = [];
  let timeoutMs = 20_000;
  let trace = false;
  let args = {};
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--trace') trace = true;
    else if (argv[i] === '--timeout-ms') timeoutMs = Number(argv[++i]);
    else if (argv[i] === '--args') {
      try {
        args = JSON.parse(argv[++i]);
      } catch {
        usage('--args is not JSON');
      }
    } else positional.push(argv[i]);
  }
  if (positional.length !== 2) usage('expected <mcp-url> and <tool>');
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) usage('bad --timeout-ms');
  if (args === null || typeof args !== 'object' || Array.isArray(args)) usage('--args must be a JSON object');
  return { url: new URL(positional[0]), tool: positional[1], args, timeoutMs, trace };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const { url, tool, args, timeoutMs, trace } = parseArgs(process.argv.slice(2));
  const deadline = Date.now() + timeoutMs;
  const timer = setTimeout(() => {
    process.stderr.write(`timeout: the flow did not reach a terminal task within ${timeoutMs} ms\n`);
    process.exit(3);
  }, timeoutMs);

  const client = tasksClient('taskhub-ts-flow');

  // notifications/tasks is an extension notification: registered with an explicit schema.
  // Frames are queued; they are read only once listen() resolved (so stdout is ack-first).
  const frames = [];
  let wake = () => {};
  client.setNotificationHandler('notifications/tasks', { params: TaskNotificationParams }, (params) => {
    frames.push(params);
    wake();
  });

  const transport = new StreamableHTTPClientTransport(url, { fetch: tracingFetch(trace) });
  await client.connect(transport, { timeout: timeoutMs });

  // What the client parses away, kept exactly as the transport delivered it, by chaining the
  // transport's public callbacks that the client installed: the ack's params (2.4.0's
  // SubscriptionFilter schema strips `taskIds` from `honoredFilter`) and the tools/call
  // response (2.4.0 cannot decode `resultType: "task"`: callTool rejects with
  // UNSUPPORTED_RESULT_TYPE and keeps nothing of the task).
  let wireAck;
  const toolCallIds = new Set();
  const wireResults = new Map();
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    if (message?.method === 'tools/call' && message.id !== undefined) toolCallIds.add(message.id);
    return send(message, options);
  };
  const deliver = transport.onmessage;
  transport.onmessage = (message, extra) => {
    if (message?.method === ACK) wireAck = message.params;
    if (message?.id !== undefined && toolCallIds.has(message.id) && message.result !== undefined) {
      wireResults.set(message.id, message.result);
    }
    deliver?.(message, extra);
  };

  emit({
    kind: 'connected',
    protocolVersion: client.getNegotiatedProtocolVersion(),
    era: client.getProtocolEra(),
    serverVersion: client.getServerVersion() ?? null,
    serverCapabilities: client.getServerCapabilities() ?? null,
  });
  emit({ kind: 'discover', result: await client.discover({ timeout: timeoutMs }) });
  emit({ kind: 'tools', tools: (await client.listTools(undefined, { timeout: timeoutMs })).tools });

  let clientError = null;
  let inline;
  try {
    inline = await client.callTool({ name: tool, arguments: args }, { timeout: timeoutMs });
  } catch (error) {
    clientError = { code: error?.code ?? null, message: String(error?.message ?? error), data: error?.data ?? null };
  }
  const created = [...wireResults.values()].find((result) => result?.resultType === 'task');
  if (created === undefined) {
    process.stderr.write(
      `tools/call ${tool} did not answer with a task: ${JSON.stringify(inline ?? clientError)}\n`,
    );
    process.exit(4);
  }
  emit({ kind: 'created', wire: created, clientError });
  const taskId = created.taskId;

  const subscription = await client.listen({ taskIds: [taskId] }, { timeout: timeoutMs });
  const granted = Array.isArray(wireAck?.notifications?.taskIds) && wireAck.notifications.taskIds.includes(taskId);
  emit({ kind: 'ack', granted, wire: wireAck ?? null });

  let final;
  if (granted) {
    const closed = subscription.closed.then((cause) => {
      throw new Error(`subscription closed (${cause}) before a terminal status`);
    });
    closed.catch(() => {});
    while (final === undefined) {
      while (frames.length > 0 && final === undefined) {
        const params = frames.shift();
        emit({ kind: 'notification', params });
        if (params.taskId === taskId && TERMINAL.has(params.status)) final = params;
      }
      if (final !== undefined) break;
      await Promise.race([new Promise((resolve) => (wake = resolve)), closed]);
    }
    await subscription.close();
  } else {
    // Declined: the ack's absent taskIds means "not honoured". Follow it with tasks/get here.
    await subscription.close();
    let last = '';
    const interval = Math.min(Math.max(Number(created.pollIntervalMs) || 500, 50), 1_000);
    while (final === undefined) {
      if (Date.now() > deadline) break;
      const got = await client.request({ method: 'tasks/get', params: { taskId } }, DetailedTaskResult, { timeout: timeoutMs });
      const seen = JSON.stringify(got);
      if (seen !== last) emit({ kind: 'poll', result: got });
      last = seen;
      if (TERMINAL.has(got.status)) final = got;
      else await sleep(interval);
    }
  }
  emit({ kind: 'final', task: final });
  clearTimeout(timer);
  await client.close();
  process.exit(0);
}

main().catch((error) => {
  process.stderr.write(`error: ${error?.stack ?? error}\n`);
  if (error?.data !== undefined) process.stderr.write(`error data: ${JSON.stringify(error.data)}\n`);
  process.exit(1);
});
