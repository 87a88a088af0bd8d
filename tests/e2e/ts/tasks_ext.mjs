// Drives one tool call through the official Tasks requester library
// @modelcontextprotocol/ext-tasks (its client entry point) on top of the real
// @modelcontextprotocol/client, against one MCP URL (protocol 2026-07-28).
//
//   node tasks_ext.mjs <mcp-url> <scenario> <tool> [--args JSON] [--answer JSON]
//                      [--token T] [--timeout-ms N] [--trace]
//
// <scenario> is one of:
//   complete  callTool(<tool>, args), settle() the execution, print every task status it saw
//             and the outcome;
//   input     the same, for a tool whose task goes input_required: the library hands each
//             input request to the session's onInputRequest, which prints it and answers
//             with --answer (an ElicitResult, e.g. {"action":"accept","content":{"ok":true}}),
//             sent by the library as tasks/update; then settle() to the outcome;
//   cancel    callTool(<tool>, args), then execution.cancel() as soon as the first task
//             status is seen, settle(), and read the task's terminal state back at the server
//             with session.task(id).result(): "cancelled", or "completed" when the tool
//             finished before the cancel reached it (the line says which).
// The tool name and its arguments are parameters, so the script drives any server whose
// tool answers tools/call with a task.
// --token T (or the environment variable MCP_BEARER_TOKEN) sends `Authorization: Bearer T`.
//
// ext-tasks 0.2.2 refuses a 2026-07-28 session unless it is given `rawDispatch` (a request
// path that hands it the raw JSON-RPC result: the SDK client rejects `resultType: "task"`)
// and `v2RequestFraming` (the _meta envelope values the client was initialised with). The raw
// path here is the client's own transport: this script owns the ids of the requests it sends
// on it (strings "ext-tasks-N"; the client's are numbers) and takes their responses off the
// transport before the client sees them. Body-derived headers (MCP-Protocol-Version,
// Mcp-Method, Mcp-Name) are set by the transport as for the client's own requests.
//
// stdout: one JSON object per line:
//   {"kind":"connected","protocolVersion":…,"era":…,"serverVersion":…,"sessionCapabilities":…}
//   {"kind":"execution","executionKind":"task"|"immediate","taskId":…|null}
//   {"kind":"status","status":…,"statusMessage":…,"task":…}   (each task event of settle();
//                                                              task = the snapshot as received)
//   {"kind":"input","inputKey":…,"request":…,"context":…}     (each input request handed over)
//   {"kind":"answer","inputKey":…,"response":…}               (what the handler returned)
//   {"kind":"cancel","atStatus":…} then {"kind":"cancelled"}   (cancel: request, then its ack)
//   {"kind":"outcome","status":…,"result"|"error":…,"task":…,"lastTask":…}   (settle()'s)
//   {"kind":"server","status":…,"result"|"error":…,"task":…}  (cancel: session.task(id).result())
//   {"kind":"libraryError","message":…}                       (the session's onError, any time)
//   {"kind":"final","scenario":…,"status":…,"race":…}          (status = the task's terminal
//       status; race, cancel only: "cancel-won" or "completion-won")
// Exit 0 after the final line; otherwise a message on stderr and a non-zero exit (1 = error,
// 2 = usage, 3 = timeout, 4 = the tool call did not answer with a task).
// --trace writes every HTTP request and response message the transport exchanges to stderr.

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';

import { PROTOCOL, TASKS_EXT, emit, tracingFetch } from './common.mjs';

const SCENARIOS = new Set(['complete', 'input', 'cancel']);
const USAGE =
  'usage: node tasks_ext.mjs <mcp-url> <complete|input|cancel> <tool> [--args JSON] [--answer JSON] ' +
  '[--token T] [--timeout-ms N] [--trace]';

function usage(message) {
  process.stderr.write(`${message}\n${USAGE}\n`);
  process.exit(2);
}

function jsonArg(name, text) {
  try {
    return JSON.parse(text);
  } catch {
    usage(`${name} is not JSON`);
  }
}

function parseArgs(argv) {
  const positional = [];
  let timeoutMs = 20_000;
  let trace = false;
  let args = {};
  let answer;
  let token = process.env.MCP_BEARER_TOKEN || undefined;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--trace') trace = true;
    else if (argv[i] === '--timeout-ms') timeoutMs = Number(argv[++i]);
    else if (argv[i] === '--args') args = jsonArg('--args', argv[++i]);
    else if (argv[i] === '--answer') answer = jsonArg('--answer', argv[++i]);
    else if (argv[i] === '--token') token = argv[++i];
    else positional.push(argv[i]);
  }
  if (positional.length !== 3) usage('expected <mcp-url> <scenario> <tool>');
  const [url, scenario, tool] = positional;
  if (!SCENARIOS.has(scenario)) usage(`unknown scenario ${JSON.stringify(scenario)}`);
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) usage('bad --timeout-ms');
  if (args === null || typeof args !== 'object' || Array.isArray(args)) usage('--args must be a JSON object');
  if (scenario === 'input' && (answer === null || typeof answer !== 'object' || Array.isArray(answer))) {
    usage('the input scenario needs --answer, an ElicitResult JSON object');
  }
  return { url: new URL(url), scenario, tool, args, answer, token, timeoutMs, trace };
}

/**
 * The host request coordinator ext-tasks needs for 2026-07-28 task traffic: sends a JSON-RPC
 * request on the client's transport under an id of its own and resolves with the raw response
 * ({kind:"result",result} | {kind:"error",error}), which the SDK client would have decoded
 * (and, for `resultType: "task"`, rejected). Install it after client.connect().
 */
function rawCoordinator(transport, defaultTimeoutMs) {
  let next = 0;
  const pending = new Map();
  const deliver = transport.onmessage;
  transport.onmessage = (message, extra) => {
    const id = message?.id;
    if (typeof id === 'string' && pending.has(id) && ('result' in message || 'error' in message)) {
      const settle = pending.get(id);
      pending.delete(id);
      settle(message.error !== undefined ? { kind: 'error', error: message.error } : { kind: 'result', result: message.result });
      return;
    }
    deliver?.(message, extra);
  };
  return (request, options = {}) =>
    new Promise((resolve, reject) => {
      const id = `ext-tasks-${++next}`;
      const timeoutMs = options.context?.requestTimeoutMs ?? defaultTimeoutMs;
      const abort = new AbortController();
      const done = () => {
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
        pending.delete(id);
      };
      const fail = (error) => {
        done();
        abort.abort(error);
        reject(error);
      };
      const onAbort = () => fail(options.signal.reason ?? new Error('aborted'));
      const timer = setTimeout(() => fail(new Error(`${request.method} timed out after ${timeoutMs} ms`)), timeoutMs);
      if (options.signal?.aborted) return onAbort();
      options.signal?.addEventListener('abort', onAbort, { once: true });
      pending.set(id, (response) => {
        done();
        resolve(response);
      });
      // Headers ext-tasks asks for (it adds `Mcp-Name: <taskId>` to tasks/*) go through the
      // transport's per-request headers; the transport derives Mcp-Name from the body itself.
      transport
        .send({ jsonrpc: '2.0', id, ...request }, { headers: options.context?.headers, requestSignal: abort.signal })
        .catch((error) => {
          if (pending.has(id)) fail(error);
        });
    });
}

const taskLine = (view) => ({
  kind: 'status',
  status: view.status,
  statusMessage: view.statusMessage ?? null,
  task: view.raw,
});

function outcomeLine(kind, outcome, extra = {}) {
  const line = { kind, status: outcome.status };
  if (outcome.status === 'completed') line.result = outcome.result;
  if (outcome.status === 'failed') {
    line.error = { message: outcome.error.message, code: outcome.error.code ?? null, data: outcome.error.data ?? null };
  }
  line.task = outcome.task?.raw ?? null;
  return { ...line, ...extra };
}

async function main() {
  const { url, scenario, tool, args, answer, token, timeoutMs, trace } = parseArgs(process.argv.slice(2));
  const timer = setTimeout(() => {
    process.stderr.write(`timeout: the ${scenario} scenario did not finish within ${timeoutMs} ms\n`);
    process.exit(3);
  }, timeoutMs);

  // What the client is initialised with is also the V2 framing ext-tasks stamps on its requests.
  const clientInfo = { name: 'taskhub-ts-ext-tasks', version: '0.0.0' };
  const clientCapabilities = { elicitation: { form: {} }, extensions: { [TASKS_EXT]: {} } };
  const client = new Client(clientInfo, {
    capabilities: clientCapabilities,
    versionNegotiation: { mode: { pin: PROTOCOL } },
  });
  client.onerror = (error) => process.stderr.write(`client error: ${error?.stack ?? error}\n`);
  const transport = new StreamableHTTPClientTransport(url, {
    fetch: tracingFetch(trace),
    ...(token ? { requestInit: { headers: { Authorization: `Bearer ${token}` } } } : {}),
  });
  await client.connect(transport, { timeout: timeoutMs });
  const protocolVersion = client.getNegotiatedProtocolVersion();

  const session = createTaskSessionFromClient(client, {
    endpointId: `taskhub-e2e:${url.href}`,
    rawDispatch: rawCoordinator(transport, timeoutMs),
    v2RequestFraming: { protocolVersion, clientInfo, clientCapabilities },
    onInputRequest: async (request, context) => {
      emit({
        kind: 'input',
        inputKey: context.inputId ?? null,
        request,
        context: { scope: context.scope, delivery: context.delivery, taskId: context.taskId ?? null },
      });
      // Outside the input scenario nothing is expected; an elicitation is then cancelled.
      const response = answer ?? { action: 'cancel' };
      emit({ kind: 'answer', inputKey: context.inputId ?? null, response });
      return response;
    },
    onError: (error) => emit({ kind: 'libraryError', message: String(error?.message ?? error) }),
  });
  emit({
    kind: 'connected',
    protocolVersion,
    era: client.getProtocolEra(),
    serverVersion: client.getServerVersion() ?? null,
    sessionCapabilities: session.capabilities,
  });

  const execution = await session.callTool(tool, args, { requestTimeoutMs: timeoutMs });
  emit({ kind: 'execution', executionKind: execution.kind, taskId: execution.handle?.taskId ?? null });
  if (execution.kind !== 'task') {
    const { outcome } = await execution.settle();
    process.stderr.write(`tools/call ${tool} did not answer with a task: ${JSON.stringify(outcome)}\n`);
    process.exit(4);
  }
  const taskId = execution.handle.taskId;

  let cancelling;
  const onEvent = (event) => {
    if (event.type !== 'task') return;
    emit(taskLine(event.task));
    if (scenario === 'cancel' && cancelling === undefined) {
      emit({ kind: 'cancel', atStatus: event.task.status });
      cancelling = execution.cancel().then(() => emit({ kind: 'cancelled' }));
    }
  };
  const { outcome, lastTask } = await execution.settle({ onEvent });
  await cancelling;
  emit(outcomeLine('outcome', outcome, { lastTask: lastTask?.raw ?? null }));

  let status = outcome.status;
  let race = null;
  if (scenario === 'cancel') {
    // settle() ends at the server's cancel ack (cancellation is cooperative, so the library does
    // not wait for a terminal status); the task's own terminal state is read back at the server.
    const server = await session.task(taskId, { requestTimeoutMs: timeoutMs }).result();
    emit(outcomeLine('server', server));
    status = server.status;
    race = status === 'completed' ? 'completion-won' : 'cancel-won';
  }
  emit({ kind: 'final', scenario, status, race });
  clearTimeout(timer);
  await session.close();
  await client.close();
  process.exit(0);
}

main().catch((error) => {
  process.stderr.write(`error: ${error?.stack ?? error}\n`);
  if (error?.cause !== undefined) process.stderr.write(`cause: ${error.cause?.stack ?? JSON.stringify(error.cause)}\n`);
  if (error?.data !== undefined) process.stderr.write(`error data: ${JSON.stringify(error.data)}\n`);
  process.exit(1);
});
