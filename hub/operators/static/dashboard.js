// taskhub dashboard: one EventSource on /operator/stream (docs/dashboard.md), a Map of
// taskId → {owner, server, task}, and a renderer that touches the DOM at most once per
// animation frame and only for the rows in view, so 10,000 tasks at 1,000 changes/s stay
// smooth. Task data only ever reaches the page through textContent, never as HTML.
"use strict";

(() => {
  const STATUSES = ["working", "input_required", "completed", "failed", "cancelled"];
  const TERMINAL = new Set(["completed", "failed", "cancelled"]);
  const ROW_H = 36; // px; the virtual list's fixed row height (.row in dashboard.css)
  const OVERSCAN = 8; // rows rendered above and below the visible ones
  // Re-filtering and re-sorting the whole view may take at most this share of the main
  // thread: every frame for a few hundred tasks, every ~50 ms for 10,000.
  const LIST_BUDGET = 0.1;
  const LIST_WAIT_MAX_MS = 250;
  const CHART_POINTS = 60; // seconds of history in the charts
  const ATTENTION_CAP = 50; // items listed per attention section
  const STALL_MS = 15000; // fleet comes every 2 s after synced; silence this long = dead
  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 30000;
  const STREAM_PARAMS = ["server", "status", "owner"];

  const $ = (id) => document.getElementById(id);

  // -- views shared with `taskhub tail` (docs/dashboard.md "Views shared by ...") --------

  // The leftmost percentage or fraction in a status message, as 0..1; null when none.
  // Same rule as hub/operators/tail_view.py `progress`: decimal percentages, whole-number fractions.
  const PROGRESS_RE = /(\d+(?:\.\d+)?)\s*%|(\d+)\s*(?:\/|\bof\b)\s*(\d+)/;

  function progressOf(message) {
    if (typeof message !== "string") return null;
    const m = PROGRESS_RE.exec(message);
    if (!m) return null;
    let value;
    if (m[1] !== undefined) value = Number(m[1]) / 100;
    else {
      const whole = Number(m[3]);
      if (!(whole > 0)) return null;
      value = Number(m[2]) / whole;
    }
    return Number.isFinite(value) ? Math.min(1, Math.max(0, value)) : null;
  }

  function isStuck(entry, now) {
    const t = entry.task;
    if (TERMINAL.has(t.status) || Number.isNaN(entry.updatedMs)) return false;
    const poll = Number.isInteger(t.pollIntervalMs) ? t.pollIntervalMs : 1000;
    return now - entry.updatedMs >= Math.max(10 * poll, 30000);
  }

  function expiresIn(entry, now) {
    const t = entry.task;
    if (TERMINAL.has(t.status) || typeof t.ttlMs !== "number") return null;
    return entry.createdMs + t.ttlMs - now;
  }

  const isExpiring = (entry, now) => {
    const left = expiresIn(entry, now);
    return left !== null && left < 60000;
  };

  // -- state ----------------------------------------------------------------------------

  const state = {
    tasks: new Map(), // taskId → entry, the view since the last `synced`
    staging: null, // Map being filled by a new stream until its `synced`
    synced: false,
    counts: Object.fromEntries(STATUSES.map((s) => [s, 0])),
    hello: null,
    ready: true,
    fleet: [],
    silentServers: new Map(), // server → reason
    offsets: [], // recent (hub `at` − local now) samples
    selected: null, // taskId
    detailOpen: false,
    detailGone: false, // the selected task left the view; the panel shows goneEntry
    goneEntry: null,
    filter: { statuses: new Set(STATUSES), server: "", text: "" },
    sort: "updated",
    list: [], // the filtered, sorted entries
    held: null, // taskId → row index while the order is held, else null
    listAt: 0, // when the list was last rebuilt (performance.now())
    listCost: 0, // how long a rebuild takes, ms, smoothed
    stuck: new Set(),
    expiring: new Set(),
    pendingLatency: [], // lastUpdatedAt (ms) of changes not yet on screen
    second: { updates: 0, removed: 0, latencies: [] },
    chartData: [[], [], [], [], []],
  };

  const dirty = { list: true, counts: true, rows: true, detail: false, attention: true };
  let frameRequested = false;

  function hubNow() {
    if (state.offsets.length === 0) return Date.now();
    // Each sample is late by its network delay, never early: the largest is the closest.
    return Date.now() + Math.max(...state.offsets);
  }

  function noteHubClock(at) {
    if (typeof at !== "number") return;
    state.offsets.push(at - Date.now());
    if (state.offsets.length > 8) state.offsets.shift();
  }

  function requestFrame() {
    if (frameRequested) return;
    frameRequested = true;
    requestAnimationFrame(render);
  }

  function makeEntry(data) {
    const task = data.task;
    return {
      id: task.taskId,
      owner: typeof data.owner === "string" ? data.owner : "",
      server: typeof data.server === "string" ? data.server : "",
      task,
      createdMs: Date.parse(task.createdAt),
      updatedMs: Date.parse(task.lastUpdatedAt),
      haystack: null, // lower-cased text for the free-text filter, built on demand
    };
  }

  function countEntry(entry, delta) {
    if (Object.hasOwn(state.counts, entry.task.status)) state.counts[entry.task.status] += delta;
  }

  function recount() {
    for (const s of STATUSES) state.counts[s] = 0;
    for (const entry of state.tasks.values()) countEntry(entry, 1);
  }

  // -- stream events --------------------------------------------------------------------

  function onHello(data) {
    state.hello = data;
    noteHubClock(data.at);
    state.staging = new Map(); // a new stream re-sends everything; swap at `synced`
    state.synced = false;
    // `anonymous` is every caller of an open hub (docs/dashboard.md, who sees what).
    $("principal").textContent =
      data.principal === "anonymous" && !data.operator
        ? "open hub: anonymous"
        : data.principal
          ? `signed in as ${data.principal}`
          : "";
    $("principal").title = data.operator ? "operator: sees every task" : "sees own tasks";
    // Signed in: the hub knows the caller by a token (an open hub calls everyone anonymous).
    $("sign-out").hidden = data.principal === "anonymous" && !data.operator;
    document.body.classList.toggle("operator", Boolean(data.operator));
    const parts = [];
    for (const key of STREAM_PARAMS) {
      const values = data.filters && data.filters[key];
      if (!Array.isArray(values) || !values.length) continue;
      // A non-operator's stream always keeps their own tasks: not worth a mention.
      if (key === "owner" && !data.operator && values.join() === data.principal) continue;
      parts.push(`${key}=${values.join(",")}`);
    }
    $("stream-filters").textContent = parts.length ? `stream: ${parts.join(" ")}` : "";
    setConnection("syncing", "syncing");
    requestFrame();
  }

  function onTask(data) {
    if (!data || !data.task || typeof data.task.taskId !== "string") return;
    const entry = makeEntry(data);
    if (state.staging) {
      state.staging.set(entry.id, entry);
      return;
    }
    const previous = state.tasks.get(entry.id);
    if (previous) countEntry(previous, -1);
    countEntry(entry, 1);
    state.tasks.set(entry.id, entry);
    state.second.updates += 1;
    // Measured at the next frame; a hidden tab draws none, so it measures nothing.
    if (!document.hidden && !Number.isNaN(entry.updatedMs) && state.pendingLatency.length < 20000) {
      state.pendingLatency.push(entry.updatedMs);
    }
    if (entry.id === state.selected) {
      state.detailGone = false;
      dirty.detail = true;
    }
    dirty.list = dirty.counts = true;
    requestFrame();
  }

  function onRemoved(data) {
    const id = data && data.taskId;
    if (state.staging) {
      state.staging.delete(id);
      return;
    }
    const previous = state.tasks.get(id);
    if (!previous) return;
    countEntry(previous, -1);
    state.tasks.delete(id);
    state.second.removed += 1;
    if (id === state.selected) {
      state.detailGone = true;
      state.goneEntry = previous;
      dirty.detail = true;
    }
    dirty.list = dirty.counts = true;
    requestFrame();
  }

  function onSynced() {
    if (state.staging) {
      // Tasks not re-sent before `synced` are gone.
      if (state.selected && state.tasks.has(state.selected)) {
        state.goneEntry = state.tasks.get(state.selected);
      }
      state.tasks = state.staging;
      state.staging = null;
      recount();
      state.detailGone = state.selected !== null && !state.tasks.has(state.selected);
    }
    state.synced = true;
    setConnection("live", "live");
    dirty.list = dirty.counts = dirty.detail = dirty.attention = true;
    requestFrame();
  }

  function onFleet(data) {
    noteHubClock(data.at);
    state.ready = data.ready !== false;
    state.fleet = Array.isArray(data.servers) ? data.servers : [];
    state.silentServers = new Map();
    for (const s of state.fleet) {
      if (s && s.silent) state.silentServers.set(s.server, s.reason || "silent");
    }
    $("ready-banner").hidden = state.ready;
    dirty.attention = dirty.rows = true;
    requestFrame();
  }

  // -- connection -----------------------------------------------------------------------

  let source = null;
  let backoff = BACKOFF_MIN_MS;
  let retryTimer = 0;
  let lastEventAt = 0;

  function streamQuery() {
    const page = new URLSearchParams(location.search);
    const query = new URLSearchParams();
    for (const key of STREAM_PARAMS) for (const v of page.getAll(key)) query.append(key, v);
    const text = query.toString();
    return text ? `?${text}` : "";
  }

  function setConnection(cls, text) {
    const el = $("conn");
    el.className = `conn conn-${cls}`;
    el.textContent = text;
  }

  function showBanner(text) {
    const el = $("banner");
    el.textContent = text;
    el.hidden = !text;
  }

  function handler(fn) {
    return (event) => {
      lastEventAt = Date.now();
      let data;
      try {
        data = JSON.parse(event.data);
      } catch {
        return; // not ours to guess at
      }
      fn(data);
    };
  }

  function connect() {
    clearTimeout(retryTimer);
    if (source) source.close();
    lastEventAt = Date.now();
    const es = new EventSource(`/operator/stream${streamQuery()}`);
    source = es;
    es.addEventListener("open", () => {
      backoff = BACKOFF_MIN_MS;
      tokenJustSet = false;
      showBanner("");
      $("sign-in").hidden = true;
      setConnection("syncing", "connected");
    });
    es.addEventListener("hello", handler(onHello));
    es.addEventListener("task", handler(onTask));
    es.addEventListener("removed", handler(onRemoved));
    es.addEventListener("synced", handler(onSynced));
    es.addEventListener("fleet", handler(onFleet));
    es.addEventListener("bye", () => {
      lastEventAt = Date.now(); // the hub ends the stream; EventSource reconnects itself
    });
    es.addEventListener("error", () => {
      if (source !== es) return;
      disconnected();
      if (es.readyState === EventSource.CLOSED) diagnose(es);
    });
  }

  function disconnected() {
    state.synced = false;
    setConnection("down", "disconnected");
    showBanner("Disconnected — reconnecting…");
  }

  // EventSource gave up (a non-200 answer): ask the same URL for its status alone, so a
  // missing token (401) is told apart from a hub that is down or busy.
  async function diagnose(es) {
    es.close();
    const controller = new AbortController();
    let status = 0;
    let retryAfter = 0;
    let message = "";
    try {
      const response = await fetch(`/operator/stream${streamQuery()}`, {
        signal: controller.signal,
        credentials: "same-origin",
        headers: { Accept: "text/event-stream" },
      });
      status = response.status;
      retryAfter = Number(response.headers.get("Retry-After")) || 0;
      if (status >= 400 && status < 500 && status !== 401) {
        try {
          message = (await response.json()).error.message;
        } catch {
          message = "";
        }
      }
    } catch {
      status = 0; // network error: the hub is down
    } finally {
      controller.abort();
    }
    if (source !== es) return; // someone reconnected meanwhile
    if (status === 401) {
      clearView(); // what the old credentials showed is not this caller's to see
      setConnection("down", "signed out");
      showBanner("This hub needs a token: sign in below.");
      // Straight after a sign-in, the 401 is about the token just given.
      $("sign-in-error").textContent = tokenJustSet
        ? "The hub did not accept that token (expired, or signed by another key?)."
        : "";
      tokenJustSet = false;
      showSignIn();
      return;
    }
    if (status === 400 || status === 403) {
      showBanner(`The hub refused the stream (${status}): ${message || "see the hub's log"}`);
    }
    if (status === 200) backoff = BACKOFF_MIN_MS; // it recovered between the two requests
    scheduleReconnect(Math.max(backoff, retryAfter * 1000));
    backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
  }

  function scheduleReconnect(delay) {
    clearTimeout(retryTimer);
    const jitter = delay * 0.2 * Math.random();
    retryTimer = setTimeout(connect, delay + jitter);
  }

  // -- sign-in --------------------------------------------------------------------------

  let tokenJustSet = false;

  // The hub checks the token and sets its cookie itself, HttpOnly: this page never holds
  // it (docs/dashboard.md, signing in). POST signs in, DELETE signs out.
  function session(method, body) {
    return fetch("/dashboard/session", {
      method,
      credentials: "same-origin",
      headers: body === undefined ? {} : { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  }

  function showSignIn() {
    $("sign-in").hidden = false;
    $("sign-out").hidden = true;
    $("token").focus();
  }

  $("sign-in").addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    if (!token || /\s/.test(token)) {
      $("sign-in-error").textContent = "That does not look like a token.";
      return;
    }
    $("sign-in-error").textContent = "";
    let status = 0;
    try {
      status = (await session("POST", { token })).status;
    } catch {
      status = 0;
    }
    if (status !== 204) {
      $("sign-in-error").textContent =
        status === 401 || status === 400
          ? "The hub did not accept that token (expired, or signed by another key?)."
          : `The hub could not sign you in (${status || "no answer"}).`;
      return;
    }
    tokenJustSet = true;
    $("token").value = "";
    $("sign-in").hidden = true;
    backoff = BACKOFF_MIN_MS;
    connect();
  });

  function clearView() {
    state.tasks = new Map();
    state.staging = null;
    state.fleet = [];
    state.silentServers = new Map();
    state.stuck = new Set();
    state.expiring = new Set();
    state.selected = null;
    closeDetail();
    recount();
    $("principal").textContent = "";
    dirty.list = dirty.counts = dirty.attention = dirty.rows = true;
    requestFrame();
  }

  $("sign-out").addEventListener("click", async () => {
    try {
      await session("DELETE");
    } catch {
      // the hub is down: the stream's reconnect shows it
    }
    $("sign-out").hidden = true;
    clearView();
    connect();
  });

  // -- filters --------------------------------------------------------------------------

  const toggles = new Map(); // status → {button, count}

  function buildToggles() {
    const box = $("status-toggles");
    for (const status of STATUSES) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = `toggle st-${status}`;
      button.dataset.testid = `status-toggle-${status}`;
      button.setAttribute("aria-pressed", "true");
      const label = document.createElement("span");
      label.textContent = status.replace("_", " ");
      const count = document.createElement("strong");
      count.dataset.testid = `count-${status}`;
      count.textContent = "0";
      button.append(label, " ", count);
      button.addEventListener("click", () => {
        const on = state.filter.statuses.has(status);
        if (on) state.filter.statuses.delete(status);
        else state.filter.statuses.add(status);
        button.setAttribute("aria-pressed", String(!on));
        filtersChanged();
      });
      box.append(button);
      toggles.set(status, { button, count });
    }
  }

  function filtersChanged() {
    dirty.list = true;
    state.listAt = 0; // apply at once, not at the next throttle slot
    $("viewport").scrollTop = 0;
    requestFrame();
  }

  $("server-filter").addEventListener("change", (e) => {
    state.filter.server = e.target.value;
    filtersChanged();
  });
  $("text-filter").addEventListener("input", (e) => {
    state.filter.text = e.target.value.trim().toLowerCase();
    filtersChanged();
  });
  $("sort").addEventListener("change", (e) => {
    state.sort = e.target.value;
    filtersChanged();
  });

  function matches(entry) {
    const f = state.filter;
    if (!f.statuses.has(entry.task.status)) return false;
    if (f.server && entry.server !== f.server) return false;
    if (f.text) {
      if (entry.haystack === null) {
        const t = entry.task;
        entry.haystack =
          `${entry.id}\n${entry.server}\n${entry.owner}\n${t.statusMessage || ""}`.toLowerCase();
      }
      if (!entry.haystack.includes(f.text)) return false;
    }
    return true;
  }

  const byId = (a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
  const newest = (a, b, key) => (b[key] || 0) - (a[key] || 0) || byId(a, b);
  const SORTS = {
    updated: (a, b) => newest(a, b, "updatedMs"),
    created: (a, b) => newest(a, b, "createdMs"),
    status: (a, b) =>
      STATUSES.indexOf(a.task.status) - STATUSES.indexOf(b.task.status) ||
      newest(a, b, "updatedMs"),
  };

  function rebuildList() {
    const list = [];
    for (const entry of state.tasks.values()) if (matches(entry)) list.push(entry);
    const order = SORTS[state.sort] || SORTS.updated;
    const rank = state.held;
    if (rank) {
      // Rows keep their places while the user points at or works in the list, so a row
      // never moves away under the cursor; tasks new to the list go on top.
      list.sort((a, b) => {
        const ra = rank.get(a.id);
        const rb = rank.get(b.id);
        if (ra === undefined || rb === undefined) {
          return ra === rb ? order(a, b) : ra === undefined ? -1 : 1;
        }
        return ra - rb;
      });
    } else list.sort(order);
    state.list = list;
  }

  function hold(on) {
    if (on === Boolean(state.held)) return;
    state.held = on ? new Map(state.list.map((entry, i) => [entry.id, i])) : null;
    dirty.list = true;
    requestFrame();
  }

  // -- rendering ------------------------------------------------------------------------

  function render() {
    frameRequested = false;
    const now = performance.now();
    if (dirty.list) {
      const wait = Math.min(LIST_WAIT_MAX_MS, state.listCost / LIST_BUDGET);
      if (now - state.listAt >= wait) {
        rebuildList();
        const cost = performance.now() - now;
        state.listCost = 0.8 * state.listCost + 0.2 * cost; // smoothed: one GC pause is not a trend
        state.listAt = now;
        dirty.list = false;
        dirty.rows = true;
      } else {
        requestFrame(); // come back when the throttle slot opens
      }
    }
    if (dirty.counts) renderCounts();
    if (dirty.rows) renderRows();
    if (dirty.detail) renderDetail();
    if (dirty.attention) renderAttention();
    // Everything received so far is now on screen (unless the list is waiting for its
    // throttle slot): its write→display latency is known.
    if (state.pendingLatency.length && !dirty.list) {
      const at = hubNow();
      const bucket = state.second.latencies;
      for (const updated of state.pendingLatency) bucket.push(Math.max(0, at - updated));
      state.pendingLatency.length = 0;
    }
  }

  function renderCounts() {
    dirty.counts = false;
    let total = 0;
    for (const status of STATUSES) {
      const n = state.counts[status];
      total += n;
      const t = toggles.get(status);
      const text = String(n);
      if (t.count.textContent !== text) t.count.textContent = text;
    }
    $("count-total").textContent = String(total);
  }

  const pool = []; // row elements, reused as the view scrolls
  const viewport = $("viewport");
  const spacer = $("spacer");

  function makeRow() {
    const row = document.createElement("div");
    row.className = "row";
    row.setAttribute("role", "row");
    row.dataset.testid = "task-row";
    row.style.height = `${ROW_H}px`;
    const cell = (cls) => {
      const span = document.createElement("span");
      span.className = cls;
      span.setAttribute("role", "gridcell");
      row.append(span);
      return span;
    };
    const status = cell("c-status");
    const badge = document.createElement("span");
    badge.className = "badge";
    const mark = document.createElement("span");
    mark.className = "mark";
    status.append(badge, mark);
    const cells = {
      badge,
      mark,
      id: cell("c-id"),
      server: cell("c-server"),
      owner: cell("c-owner"),
      age: cell("c-age"),
      updated: cell("c-updated"),
      message: cell("c-message"),
    };
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.setAttribute("role", "progressbar");
    bar.setAttribute("aria-valuemin", "0");
    bar.setAttribute("aria-valuemax", "100");
    const fill = document.createElement("span");
    fill.className = "fill";
    bar.append(fill);
    const text = document.createElement("span");
    text.className = "msg";
    cells.message.append(bar, text);
    cells.bar = bar;
    cells.fill = fill;
    cells.text = text;
    row.cells_ = cells;
    row.addEventListener("click", () => {
      select(row.dataset.taskId, false);
      openDetail();
    });
    return row;
  }

  function setText(el, text) {
    if (el.textContent !== text) el.textContent = text;
  }

  function renderRows() {
    dirty.rows = false;
    const list = state.list;
    const height = `${list.length * ROW_H}px`;
    if (spacer.style.height !== height) {
      spacer.style.height = height;
      $("grid").setAttribute("aria-rowcount", String(list.length + 1));
    }
    const first = Math.max(0, Math.floor(viewport.scrollTop / ROW_H) - OVERSCAN);
    const visible = Math.ceil((viewport.clientHeight || 600) / ROW_H) + 2 * OVERSCAN;
    const last = Math.min(list.length, first + visible);
    while (pool.length < last - first) {
      const row = makeRow();
      pool.push(row);
      viewport.append(row);
    }
    const now = hubNow();
    let active = "";
    for (let i = 0; i < pool.length; i += 1) {
      const row = pool[i];
      const index = first + i;
      if (index >= last) {
        if (!row.hidden) {
          row.hidden = true;
          row.entry_ = null;
          delete row.dataset.taskId; // a spare row is no task's
        }
        continue;
      }
      if (row.hidden) row.hidden = false;
      fillRow(row, list[index], index, now);
      if (list[index].id === state.selected) active = row.id;
    }
    const grid = $("grid");
    if (active !== (grid.getAttribute("aria-activedescendant") || "")) {
      if (active) grid.setAttribute("aria-activedescendant", active);
      else grid.removeAttribute("aria-activedescendant");
    }
    const total = state.tasks.size;
    const note = state.staging
      ? `loading ${state.staging.size} tasks…`
      : list.length === total
        ? `${total} tasks`
        : `showing ${list.length} of ${total} tasks`;
    setText($("showing"), state.held ? `${note} · order held while you point at the list` : note);
    $("empty").hidden = list.length > 0;
    setText($("empty"), total ? "No task matches the filters." : "No tasks yet.");
  }

  // Entries are replaced, never mutated, on each change: a row showing the same entry at
  // the same place with the same markers needs only its clock cells refreshed. Attribute
  // writes are skipped when nothing changed, as each one costs the browser a style pass.
  function fillRow(row, entry, index, now) {
    const c = row.cells_;
    const selected = entry.id === state.selected;
    const silent = state.silentServers.get(entry.server);
    const marks =
      (state.stuck.has(entry.id) ? "stuck " : "") +
      (state.expiring.has(entry.id) ? "expiring" : "");
    const key = `${index}|${selected}|${marks}|${silent}`;
    if (row.entry_ !== entry || row.key_ !== key) {
      row.entry_ = entry;
      row.key_ = key;
      paintRow(row, c, entry, index, selected, marks.trim(), silent);
    }
    setText(c.age, ago(now - entry.createdMs));
    setText(c.updated, ago(now - entry.updatedMs));
  }

  function paintRow(row, c, entry, index, selected, marks, silent) {
    const t = entry.task;
    row.style.transform = `translateY(${index * ROW_H}px)`;
    row.dataset.taskId = entry.id;
    row.dataset.status = t.status;
    row.id = `row-${index}`;
    row.setAttribute("aria-rowindex", String(index + 2));
    row.setAttribute("aria-selected", String(selected));
    row.classList.toggle("selected", selected);
    const badge = `badge st-${t.status}`;
    if (c.badge.className !== badge) c.badge.className = badge;
    setText(c.badge, t.status.replace("_", " "));
    setText(c.mark, marks);
    setText(c.id, entry.id);
    setText(c.server, entry.server);
    c.server.classList.toggle("silent", silent !== undefined);
    c.server.title = silent === undefined ? "" : `silent: ${silent}`;
    setText(c.owner, entry.owner);
    const message = t.statusMessage || "";
    setText(c.text, message);
    c.message.title = message;
    const progress = progressOf(message);
    c.bar.hidden = progress === null;
    if (progress !== null) {
      const percent = Math.round(progress * 1000) / 10;
      c.fill.style.width = `${percent}%`;
      c.bar.setAttribute("aria-valuenow", String(percent));
    }
  }

  function ago(ms) {
    if (!Number.isFinite(ms)) return "";
    const s = Math.max(0, Math.floor(ms / 1000));
    if (s < 60) return `${s}s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${s % 60}s`;
    const h = Math.floor(m / 60);
    if (h < 48) return `${h}h ${m % 60}m`;
    return `${Math.floor(h / 24)}d`;
  }

  let pointerInside = false;
  let focusInside = false;
  viewport.addEventListener("pointerenter", () => hold((pointerInside = true)));
  viewport.addEventListener("pointerleave", () => hold((pointerInside = false) || focusInside));
  // Keyboard focus holds the order too (a mouse click that focuses the list does not, or
  // the order would stay held after the pointer left).
  $("grid").addEventListener("focus", () => {
    focusInside = $("grid").matches(":focus-visible");
    hold(focusInside || pointerInside);
  });
  $("grid").addEventListener("blur", () => hold((focusInside = false) || pointerInside));

  viewport.addEventListener(
    "scroll",
    () => {
      dirty.rows = true;
      requestFrame();
    },
    { passive: true },
  );
  window.addEventListener("resize", () => {
    dirty.rows = true;
    resizeCharts();
    requestFrame();
  });

  // -- selection and keyboard -----------------------------------------------------------

  function select(id, scroll) {
    state.selected = id;
    dirty.rows = true;
    if (state.detailOpen) {
      state.detailGone = !state.tasks.has(id);
      dirty.detail = true;
    }
    if (scroll) {
      const index = state.list.findIndex((e) => e.id === id);
      if (index >= 0) {
        const top = index * ROW_H;
        if (top < viewport.scrollTop) viewport.scrollTop = top;
        else if (top + ROW_H > viewport.scrollTop + viewport.clientHeight) {
          viewport.scrollTop = top + ROW_H - viewport.clientHeight;
        }
      }
    }
    requestFrame();
  }

  function moveSelection(delta) {
    const list = state.list;
    if (!list.length) return;
    let index = list.findIndex((e) => e.id === state.selected);
    if (index < 0) index = delta > 0 ? -1 : list.length;
    const next = Math.min(list.length - 1, Math.max(0, index + delta));
    select(list[next].id, true);
  }

  $("grid").addEventListener("keydown", (event) => {
    if (!focusInside) hold((focusInside = true));
    const page = Math.max(1, Math.floor(viewport.clientHeight / ROW_H) - 1);
    const moves = { ArrowDown: 1, ArrowUp: -1, PageDown: page, PageUp: -page };
    if (event.key in moves) moveSelection(moves[event.key]);
    else if (event.key === "Home") moveSelection(-Infinity);
    else if (event.key === "End") moveSelection(Infinity);
    else if (event.key === "Enter" || event.key === " ") {
      if (!state.selected) moveSelection(1);
      if (state.selected) openDetail();
    } else return;
    event.preventDefault();
  });

  document.addEventListener("keydown", (event) => {
    const target = event.target;
    const typing =
      target instanceof HTMLInputElement ||
      target instanceof HTMLSelectElement ||
      target instanceof HTMLTextAreaElement;
    if (event.key === "/" && !typing && !event.ctrlKey && !event.metaKey && !event.altKey) {
      event.preventDefault();
      $("text-filter").focus();
      $("text-filter").select();
    } else if (event.key === "Escape") {
      if (state.detailOpen) {
        event.preventDefault();
        closeDetail();
      } else if (target === $("text-filter")) {
        $("grid").focus();
      }
    }
  });

  // -- detail panel ---------------------------------------------------------------------

  function openDetail() {
    if (!state.selected) return;
    state.detailOpen = true;
    state.detailGone = !state.tasks.has(state.selected);
    document.body.classList.add("detail-open");
    $("detail").hidden = false;
    dirty.detail = true;
    renderDetail();
    $("detail-close").focus();
  }

  function closeDetail() {
    if (!state.detailOpen) return;
    state.detailOpen = false;
    document.body.classList.remove("detail-open");
    $("detail").hidden = true;
    $("grid").focus();
  }

  $("detail-close").addEventListener("click", closeDetail);

  const pretty = (value) => JSON.stringify(value, null, 2);

  function renderDetail() {
    dirty.detail = false;
    if (!state.detailOpen) return;
    const entry = state.tasks.get(state.selected) || (state.detailGone && state.goneEntry);
    $("detail-gone").hidden = !state.detailGone;
    if (!entry || entry.id !== state.selected) {
      $("detail-title").textContent = state.selected || "Task";
      return;
    }
    const t = entry.task;
    $("detail-title").textContent = t.taskId;
    const facts = $("detail-facts");
    facts.replaceChildren();
    const now = hubNow();
    const left = expiresIn(entry, now);
    const rows = [
      ["status", t.status.replace("_", " ")],
      ["message", t.statusMessage || "—"],
      ["server", entry.server + (state.silentServers.has(entry.server) ? " (silent)" : "")],
      ["owner", entry.owner],
      ["created", `${t.createdAt} (${ago(now - entry.createdMs)} ago)`],
      ["last update", `${t.lastUpdatedAt} (${ago(now - entry.updatedMs)} ago)`],
      ["ttl", t.ttlMs === null ? "unlimited" : `${t.ttlMs} ms`],
      ["poll interval", t.pollIntervalMs === undefined ? "—" : `${t.pollIntervalMs} ms`],
    ];
    if (left !== null) rows.push(["expires", left > 0 ? `in ${ago(left)}` : "now"]);
    if (isStuck(entry, now)) rows.push(["attention", "stuck: no update for a long time"]);
    for (const [name, value] of rows) {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = value;
      if (name === "status") dd.className = `badge st-${t.status}`;
      facts.append(dt, dd);
    }
    const progress = progressOf(t.statusMessage);
    const box = $("detail-progress");
    box.replaceChildren();
    if (progress !== null) {
      const bar = document.createElement("progress");
      bar.max = 1;
      bar.value = progress;
      bar.setAttribute("aria-label", "progress");
      box.append(bar);
    }
    // setText: unchanged JSON is left alone, so a selection being copied survives.
    const section = (name, value) => {
      $(`detail-${name}-box`).hidden = value === undefined;
      setText($(`detail-${name}`), value === undefined ? "" : pretty(value));
    };
    section("input", t.inputRequests);
    section("result", t.result);
    section("error", t.error);
    setText($("detail-json"), pretty({ owner: entry.owner, server: entry.server, task: t }));
  }

  // -- attention: stuck, expiring, silent (recomputed once a second) --------------------

  function scanAttention() {
    const now = hubNow();
    const stuck = new Set();
    const expiring = new Set();
    for (const entry of state.tasks.values()) {
      if (TERMINAL.has(entry.task.status)) continue;
      if (isStuck(entry, now)) stuck.add(entry.id);
      if (isExpiring(entry, now)) expiring.add(entry.id);
    }
    state.stuck = stuck;
    state.expiring = expiring;
    dirty.attention = dirty.rows = true;
    if (state.detailOpen) dirty.detail = true;
  }

  // Items are kept by task id and only their text changes from second to second, so a
  // keyboard user's focus on one of them survives the refresh.
  function fillList(list, ids, urgency, describe) {
    const entries = [];
    for (const id of ids) {
      const entry = state.tasks.get(id);
      if (entry) entries.push(entry);
    }
    entries.sort((a, b) => urgency(a) - urgency(b) || byId(a, b)); // most urgent first
    entries.length = Math.min(entries.length, ATTENTION_CAP);
    const same =
      list.children.length === entries.length &&
      entries.every((entry, i) => list.children[i].dataset.taskId === entry.id);
    if (!same) {
      list.replaceChildren(
        ...entries.map((entry) => {
          const li = document.createElement("li");
          li.dataset.taskId = entry.id;
          const button = document.createElement("button");
          button.type = "button";
          button.className = "link";
          button.addEventListener("click", () => {
            select(entry.id, true);
            openDetail();
          });
          li.append(button);
          return li;
        }),
      );
    }
    entries.forEach((entry, i) => {
      const text = `${entry.id.slice(0, 8)} · ${entry.server} · ${describe(entry)}`;
      setText(list.children[i].firstChild, text);
    });
  }

  function renderAttention() {
    dirty.attention = false;
    const now = hubNow();
    $("stuck-count").textContent = String(state.stuck.size);
    $("expiring-count").textContent = String(state.expiring.size);
    fillList(
      $("stuck-list"),
      state.stuck,
      (e) => e.updatedMs,
      (e) => `no update for ${ago(now - e.updatedMs)}`,
    );
    fillList(
      $("expiring-list"),
      state.expiring,
      (e) => expiresIn(e, now),
      (e) => {
        const left = expiresIn(e, now);
        return left > 0 ? `expires in ${ago(left)}` : "expiring now";
      },
    );
    const silent = $("silent-list");
    const items = [];
    for (const s of state.fleet) {
      if (!s || !s.silent) continue;
      const li = document.createElement("li");
      li.dataset.testid = "silent-server";
      li.textContent = `${s.server}: ${s.reason || "silent"}`;
      items.push(li);
    }
    if (!items.length) {
      const li = document.createElement("li");
      li.className = "muted";
      // Operators get the fleet's servers, and everyone on an open hub (docs/dashboard.md).
      const hidden =
        state.hello &&
        !state.hello.operator &&
        state.hello.principal !== "anonymous" &&
        !state.fleet.length;
      li.textContent = hidden ? "visible to operators only" : "none";
      items.push(li);
    }
    silent.replaceChildren(...items);
    $("silent-count").textContent = String(state.silentServers.size);
    $("silent-box").classList.toggle("alarm", state.silentServers.size > 0);
    $("stuck-box").classList.toggle("alarm", state.stuck.size > 0);
    $("expiring-box").classList.toggle("alarm", state.expiring.size > 0);
    renderServerOptions();
  }

  function renderServerOptions() {
    const names = new Set(state.fleet.map((s) => s && s.server).filter(Boolean));
    for (const entry of state.tasks.values()) names.add(entry.server);
    const select = $("server-filter");
    const sorted = [...names].sort();
    const current = [...select.options].slice(1).map((o) => o.value);
    if (sorted.join("\n") === current.join("\n")) return;
    const keep = select.value;
    const options = [select.options[0]];
    for (const name of sorted) {
      const option = document.createElement("option");
      option.value = name;
      option.textContent = name;
      options.push(option);
    }
    select.replaceChildren(...options);
    select.value = sorted.includes(keep) || keep === "" ? keep : "";
  }

  // -- charts ---------------------------------------------------------------------------

  const charts = [];

  const clock = new Intl.DateTimeFormat(undefined, {
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    hour12: false,
  });
  // Plain clock times, spaced out: uPlot's default puts dates on a two-minute axis.
  const timeAxis = {
    space: 70,
    values: (u, splits) => splits.map((v) => clock.format(new Date(v * 1000))),
  };

  function makeCharts() {
    if (typeof window.uPlot !== "function") return; // the page still works without charts
    const common = (el) => ({
      width: Math.max(160, el.clientWidth),
      height: 130,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      // Always the last CHART_POINTS seconds, even before there is that much history.
      scales: { x: { time: true, range: (u, min, max) => [max - CHART_POINTS, max] } },
    });
    const rateEl = $("chart-rate");
    charts.push({
      el: rateEl,
      plot: new window.uPlot(
        {
          ...common(rateEl),
          series: [
            {},
            { label: "updates/s", stroke: "#1d4ed8", fill: "rgba(29,78,216,0.12)", width: 1.5 },
            { label: "removed/s", stroke: "#b45309", width: 1.5 },
          ],
          axes: [timeAxis, { size: 44 }],
        },
        [[], [], []],
        rateEl,
      ),
      pick: (d) => [d[0], d[1], d[2]],
    });
    const latencyEl = $("chart-latency");
    charts.push({
      el: latencyEl,
      plot: new window.uPlot(
        {
          ...common(latencyEl),
          series: [
            {},
            { label: "p50 ms", stroke: "#15803d", width: 1.5 },
            { label: "p99 ms", stroke: "#b91c1c", width: 1.5 },
          ],
          axes: [timeAxis, { size: 44 }],
        },
        [[], [], []],
        latencyEl,
      ),
      pick: (d) => [d[0], d[3], d[4]],
    });
  }

  function resizeCharts() {
    for (const c of charts) {
      const width = Math.max(160, c.el.clientWidth);
      if (width !== c.plot.width) c.plot.setSize({ width, height: 130 });
    }
  }

  function quantile(sorted, q) {
    if (!sorted.length) return null;
    return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  }

  function tickSecond() {
    const s = state.second;
    const latencies = s.latencies.sort((a, b) => a - b);
    const d = state.chartData;
    d[0].push(Math.floor(Date.now() / 1000));
    d[1].push(state.synced ? s.updates : null);
    d[2].push(state.synced ? s.removed : null);
    d[3].push(quantile(latencies, 0.5));
    d[4].push(quantile(latencies, 0.99));
    if (d[0].length > CHART_POINTS) for (const series of d) series.shift();
    state.second = { updates: 0, removed: 0, latencies: [] };
    for (const c of charts) c.plot.setData(c.pick(d));
    if (state.synced && lastEventAt && Date.now() - lastEventAt > STALL_MS) {
      disconnected(); // no fleet event for too long: the stream is dead without saying so
      connect();
    }
    scanAttention();
    dirty.rows = true; // ages move on
    requestFrame();
  }

  // -- start ----------------------------------------------------------------------------

  buildToggles();
  makeCharts();
  // The boxes change width with the window and with the detail panel.
  if (window.ResizeObserver) {
    const observer = new ResizeObserver(() => resizeCharts());
    for (const c of charts) observer.observe(c.el.parentElement);
  }
  connect();
  setInterval(tickSecond, 1000);
  // For tests and the curious: what the page holds, without reaching into the DOM.
  window.taskhubDashboard = { state, progressOf };
})();
