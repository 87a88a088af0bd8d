import { Client } from '@modelcontextprotocol/client';

// What the real-client scripts share: protocol names, schemas for the task results the
// client does not type, line output, and the optional wire trace.

export const PROTOCOL = '2026-07-28';
export const TASKS_EXT = 'io.modelcontextprotocol/tasks';
export const STATUSES = new Set(['working', 'input_required', 'completed', 'failed', 'cancelled']);
export const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

/** A minimal Standard Schema (v1) that accepts a JSON object and keeps every key verbatim. */
export function objectSchema(name, check = () => undefined) {
  return {
    '~standard': {
      version: 1,
      vendor: 'taskhub-e2e',
      validate(value) {
        if (value === null || typeof value !== 'object' || Array.isArray(value)) {
          return { issues: [{ message: `${name}: expected a JSON object` }] };
        }
        const problem = check(value);
        return problem ? { issues: [{ message: `${name}: ${problem}` }] } : { value };
      },
    },
  };
}

export const checkTask = (v) =>
  typeof v.taskId !== 'string' ? 'taskId is not a string' : STATUSES.has(v.status) ? undefined : `bad status ${JSON.stringify(v.status)}`;

// tasks/get result (after the client consumed `resultType`) and notifications/tasks params.
export const DetailedTaskResult = objectSchema('tasks/get result', checkTask);
export const TaskNotificationParams = objectSchema('notifications/tasks params', checkTask);

export const emit = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);

/** fetch that copies each request and each response message to stderr (only with --trace). */
export function tracingFetch(enabled) {
  if (!enabled) return undefined;
  const log = (line) => process.stderr.write(`[wire] ${JSON.stringify(line)}\n`);
  return async (input, init) => {
    const headers = Object.fromEntries(new Headers(init?.headers).entries());
    log({ dir: 'request', method: init?.method ?? 'GET', url: String(input), headers, body: init?.body ?? null });
    const response = await fetch(input, init);
    const contentType = response.headers.get('content-type') ?? '';
    log({ dir: 'response', status: response.status, contentType });
    if (response.body) {
      const copy = response.clone();
      (async () => {
        const text = copy.body.pipeThrough(new TextDecoderStream());
        let buffered = '';
        for await (const chunk of text) {
          buffered += chunk;
          let nl;
          while ((nl = buffered.indexOf('\n')) >= 0) {
            const line = buffered.slice(0, nl).replace(/\r$/, '');
            buffered = buffered.slice(nl + 1);
            if (line.startsWith('data:')) log({ dir: 'sse', data: line.slice(5).trim() });
          }
        }
        if (buffered.trim() && !contentType.includes('event-stream')) log({ dir: 'body', data: buffered });
      })().catch(() => {});
    }
    return response;
  };
}

/** A client pinned to 2026-07-28 that declares the tasks extension in every request's _meta. */
export function tasksClient(name) {
  const client = new Client(
    { name, version: '0.0.0' },
    {
      capabilities: { extensions: { [TASKS_EXT]: {} } },
      versionNegotiation: { mode: { pin: PROTOCOL } },
    },
  );
  client.onerror = (error) => process.stderr.write(`client error: ${error?.stack ?? error}\n`);
  return client;
}
