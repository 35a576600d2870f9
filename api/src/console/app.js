// The reins console: plain JavaScript over the node's HTTP API, no build step, no other origin.
//
// Rules this file keeps:
// - Every string that comes from the API (ids, emails, outputs, errors, artifact text) reaches
//   the page as a text node (`h()` and `Element.append`); nothing is ever parsed as HTML.
// - Artifact previews: the server's media type decides; text and JSON are shown as text, raster
//   images (png, jpeg, gif, webp) as an <img> from a blob URL, anything else is a download link.
// - State-changing requests repeat the `csrf_token` cookie in `X-CSRF-Token`, as the API requires
//   of cookie sessions. A 401 means the session ended: back to sign-in with a message.
// - Live updates: a page that names an event stream (Server-Sent Events) reads again when an
//   event arrives, and polls every POLL_MS_WITH_STREAM as a safety net; without a stream (the
//   node has none, or it failed) it reads again every POLL_MS. Errors back off to POLL_MS_MAX;
//   a hidden tab neither polls nor keeps its stream open.

/** How often the page shown re-reads what it shows, in milliseconds. */
const POLL_MS = 2000;
/** The longest wait between two reads after repeated errors, in milliseconds. */
const POLL_MS_MAX = 30000;
/** How often a page whose event stream is open reads again anyway, in milliseconds. */
const POLL_MS_WITH_STREAM = 15000;
/** The event kinds a stream may send (SSE delivers a named event only to its own listener). */
const EVENT_KINDS = ["message", "status", "step_journaled", "step_started", "pause_waiting",
  "checkpoint_waiting", "step_finished", "pause_resumed", "checkpoint_decided",
  "cancel_requested", "artifact", "approval_requested", "approval_answered", "log",
  "log_truncated"];
/** Workflows per page of the list. */
const LIST_PAGE_SIZE = 25;
/** Bytes of an artifact fetched for its preview; a longer text shows its beginning. */
const PREVIEW_BYTES_MAX = 256 * 1024;
/**
 * Pages of steps a workflow's page reads at first (the record answers with the first page and
 * `steps_next`; each page holds at most the node's `http.record_steps_page_max`); "More steps"
 * reads this many more.
 */
const STEP_PAGES_SHOWN = 5;

/** What a live workflow's calls may wait for (`waiting_for[].kind`, the list's filter). */
const WAIT_KINDS = ["sleep", "event", "person", "slot", "retry"];
const STATUSES = ["running", "paused", "waiting_approval", "cancelling", "completed", "failed",
  "cancelled", "needs_reconciliation"];
/** What the API shows a live workflow as, beside the stored statuses (read, never stored). */
const SHOWN = ["recoverable", "waiting_for_input"];
const LIVE = new Set(["running", "paused", "waiting_approval", "cancelling", "recoverable",
  "waiting_for_input"]);
/** Keys under which an agent usually names what an action does, and puts its arguments. */
const ACTION_NAME_KEYS = ["tool", "name", "action", "type"];
const ACTION_ARGUMENT_KEYS = ["args", "arguments", "input", "parameters"];
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const RASTER = ["image/png", "image/jpeg", "image/gif", "image/webp"];

// ---------------------------------------------------------------------------------------------
// DOM helpers: text only.

/** An element with attributes (`on*` are listeners) and children (strings become text). */
function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) {
      element.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      element.className = value;
    } else {
      element.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
}

/** A `<time>` for epoch seconds. */
function time(seconds) {
  if (typeof seconds !== "number") return "";
  const date = new Date(seconds * 1000);
  return h("time", {datetime: date.toISOString(), title: date.toISOString()},
    date.toLocaleString());
}

function duration(seconds) {
  if (typeof seconds !== "number" || !isFinite(seconds) || seconds < 0) return "";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

/**
 * A wait's length in its two largest whole units, as the CLI says it: `42 s`, `5 min 3 s`,
 * `2 h 10 min`, `1 day`, `3 days 2 h`.
 */
function roughly(seconds) {
  const total = Math.max(0, Math.round(seconds));
  const [days, hours, minutes, secs] = [Math.floor(total / 86400), Math.floor(total % 86400 / 3600),
    Math.floor(total % 3600 / 60), total % 60];
  const two = (first, second, unit) => second ? `${first} ${second} ${unit}` : first;
  if (days) return two(`${days} day${days === 1 ? "" : "s"}`, hours, "h");
  if (hours) return two(`${hours} h`, minutes, "min");
  if (minutes) return two(`${minutes} min`, secs, "s");
  return `${secs} s`;
}

/** `in 2 h 10 min` for a time after now, `5 s ago` for one before. */
function relative(at, now) {
  return at >= now ? `in ${roughly(at - now)}` : `${roughly(now - at)} ago`;
}

/** A time beside now, in the reader's time zone: its time of day, with its date on another day. */
function clockText(at, now) {
  const date = new Date(at * 1000);
  const clock = date.toLocaleTimeString([], date.getSeconds()
    ? {hour: "2-digit", minute: "2-digit", second: "2-digit"} : {hour: "2-digit", minute: "2-digit"});
  return date.toDateString() === new Date(now * 1000).toDateString() ? clock
    : `${date.toLocaleDateString()} ${clock}`;
}

/** What one call of a workflow waits for (a `waiting_for` entry), in the CLI's words. */
function waitLine(wait, now) {
  const deadline = typeof wait.deadline === "number" ? ` (deadline ${relative(wait.deadline, now)})`
    : "";
  switch (wait.kind) {
    case "sleep": return `sleeping until ${clockText(wait.until, now)} (${relative(wait.until, now)})`;
    case "event": return `waiting for event ${wait.name}${deadline}`;
    case "person": return `waiting for a person${deadline}`;
    case "slot": return "waiting for a slot";
    case "retry": return `retrying at ${clockText(wait.at, now)} (attempt ${wait.attempt}` +
      `${wait.max_attempts == null ? "" : ` of ${wait.max_attempts}`})`;
    default: return `waiting (${wait.kind})`;
  }
}

/** The waits of a record or a listing's row, one element each (text only). */
function waitsView(waits, now, attrs = {}) {
  if (!waits || !waits.length) return null;
  return h("ul", {class: "waiting-for", ...attrs}, waits.map((wait) =>
    h("li", {"data-wait": wait.kind}, waitLine(wait, now))));
}

function bytes(count) {
  if (typeof count !== "number") return "";
  if (count < 1024) return `${count} bytes`;
  if (count < 1024 * 1024) return `${(count / 1024).toFixed(1)} KiB`;
  return `${(count / 1024 / 1024).toFixed(1)} MiB`;
}

function badge(status) {
  return h("span", {class: `badge badge-${String(status).replace(/[^a-z_]/g, "")}`}, status);
}

function json(value) {
  return h("pre", {class: "json"}, JSON.stringify(value, null, 2));
}

/**
 * A workflow as people know it: a link to its page reading its title (when its launch gave
 * one) with its run id beside it, or its run id alone.
 */
function workflowLink(runId, title) {
  const href = `#/workflows/${runId}`;
  if (!title) return h("a", {href}, runId);
  return h("span", {class: "named"}, h("a", {href, class: "title"}, title), " ",
    h("code", {class: "run-id"}, runId));
}

/** A value inside an action: text as it is, anything else as compact JSON. */
function actionValue(value) {
  return typeof value === "string" ? value : h("code", {}, JSON.stringify(value));
}

/**
 * An agent's requested actions, readably: a numbered list, each action named by its `tool` (or
 * `name`, `action`, `type`) with its other fields, and those of its `args` (or `arguments`,
 * `input`, `parameters`), as a list of names and values. The JSON as the agent sent it is one
 * click away.
 */
function actionsView(actions) {
  const list = Array.isArray(actions) ? actions : actions == null ? [] : [actions];
  const items = list.map((action) => {
    if (action === null || typeof action !== "object" || Array.isArray(action)) {
      return h("li", {class: "action"}, actionValue(action));
    }
    const nameKey = ACTION_NAME_KEYS.find((key) => typeof action[key] === "string");
    const pairs = [];
    for (const [key, value] of Object.entries(action)) {
      if (key === nameKey) continue;
      if (ACTION_ARGUMENT_KEYS.includes(key) && value && typeof value === "object"
          && !Array.isArray(value)) {
        pairs.push(...Object.entries(value));
      } else {
        pairs.push([key, value]);
      }
    }
    return h("li", {class: "action"},
      nameKey ? h("strong", {class: "action-name"}, action[nameKey]) : null,
      pairs.length ? h("dl", {class: "action-fields"},
        pairs.map(([key, value]) => [h("dt", {}, key), h("dd", {}, actionValue(value))])) : null);
  });
  return h("div", {class: "actions-asked"},
    items.length ? h("ol", {class: "actions"}, items) : h("p", {class: "empty"}, "No actions."),
    h("details", {class: "raw"}, h("summary", {}, "As the agent sent it (JSON)"), json(actions)));
}

let uniqueIds = 0;
/** A labelled field: the label names the control for keyboards and screen readers. */
function field(label, control, hint) {
  const id = control.id || `f${++uniqueIds}`;
  control.id = id;
  return h("div", {class: "field"}, h("label", {for: id}, label), control,
    hint ? h("small", {}, hint) : null);
}

/**
 * Replaces `container`'s children with `build()`'s, keeping what the user typed into
 * `[data-keep]` controls (and which one had focus), so that a live update never eats a comment
 * being written.
 */
function rerender(container, build) {
  const kept = new Map();
  let focused = null;
  for (const control of container.querySelectorAll("[data-keep]")) {
    kept.set(control.dataset.keep, control.value);
    if (control === document.activeElement) focused = control.dataset.keep;
  }
  container.replaceChildren(...[build()].flat());
  for (const control of container.querySelectorAll("[data-keep]")) {
    if (kept.has(control.dataset.keep)) control.value = kept.get(control.dataset.keep);
    if (control.dataset.keep === focused) control.focus();
  }
}

/** When the status line was last written: the navigation right after keeps it, once. */
let saidAt = 0;
let carried = false;

/** The status line under the header (announced to screen readers). */
function say(message, kind = "info") {
  const status = document.getElementById("status");
  status.textContent = message || "";
  status.className = `status status-${kind}`;
  saidAt = Date.now();
  carried = false;
}

function errorText(error) {
  return error && error.message ? error.message : String(error);
}

/**
 * A button that runs `action` once at a time; a failure is shown in the status line. Returns the
 * button.
 */
function actionButton(label, action, attrs = {}) {
  const button = h("button", {type: "button", ...attrs}, label);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      await action();
    } catch (error) {
      if (error.status !== 401) say(errorText(error), "error");
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

/** A button that asks again before it acts (for what cannot be undone). */
function confirmButton(label, question, action) {
  const wrap = h("span", {class: "confirm"});
  const first = h("button", {type: "button", class: "danger"}, label);
  first.addEventListener("click", () => {
    const no = h("button", {type: "button"}, "Keep it");
    const yes = actionButton(`Yes, ${label.toLowerCase()}`, action, {class: "danger"});
    no.addEventListener("click", () => {
      wrap.replaceChildren(first);
      first.focus();
    });
    wrap.replaceChildren(h("span", {}, question), " ", yes, " ", no);
    yes.focus();
  });
  wrap.append(first);
  return wrap;
}

// ---------------------------------------------------------------------------------------------
// The API.

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [key, ...rest] = part.trim().split("=");
    if (key === name) return decodeURIComponent(rest.join("="));
  }
  return "";
}

/** One API call: JSON in and out, the CSRF header on every state-changing request. */
async function api(method, path, body, {form, quiet401} = {}) {
  const headers = {Accept: "application/json"};
  if (method !== "GET") headers["X-CSRF-Token"] = cookie("csrf_token");
  let payload;
  if (form) {
    headers["Content-Type"] = "application/x-www-form-urlencoded";
    payload = new URLSearchParams(form).toString();
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, {method, headers, body: payload, credentials: "same-origin",
      cache: "no-store"});
  } catch (error) {
    throw new ApiError(0, "network", `the node did not answer (${errorText(error)})`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = data && data.error ? data.error
      : {code: `http_${response.status}`, message: `${response.status} ${response.statusText}`};
    if (response.status === 401 && !quiet401) sessionEnded();
    throw new ApiError(response.status, error.code, error.message);
  }
  return data;
}

function workflowPath(runId) {
  return `/api/v1/workflows/${encodeURIComponent(runId)}`;
}

// ---------------------------------------------------------------------------------------------
// Artifacts: previews decided by the server's media type.

/** A preview of artifact `version` of `runId`, filled in once its bytes arrive. */
function artifactPreview(runId, version, about = null) {
  const url = `${workflowPath(runId)}/artifacts/${encodeURIComponent(version)}`;
  const name = about && about.name ? about.name : `artifact-${version}`;
  const download = h("a", {href: url, download: name, class: "download"},
    `Download version ${version}`);
  const body = h("div", {class: "preview-body"}, "Loading the preview…");
  const facts = about ? [` · ${name}`, ` · ${bytes(about.bytes)}`, ` · ${about.media_type}`,
    about.step_id ? ` · from step ${about.step_id}` : null] : [];
  const box = h("figure", {class: "artifact", "data-artifact": version}, body,
    h("figcaption", {}, `Artifact version ${version}`, facts, " · ", download));
  fillPreview(url, version, body).catch((error) => {
    body.replaceChildren(h("span", {class: "error"}, `No preview: ${errorText(error)}`));
  });
  return box;
}

async function fillPreview(url, version, body) {
  const response = await fetch(url, {credentials: "same-origin",
    headers: {Range: `bytes=0-${PREVIEW_BYTES_MAX - 1}`}});
  if (response.status === 401) {
    sessionEnded();
    return;
  }
  // Any byte range of an empty artifact is unsatisfiable (RFC 9110): it is simply empty.
  if (response.status === 416 && (response.headers.get("content-range") || "") === "bytes */0") {
    body.replaceChildren(h("span", {class: "empty"}, "Empty: 0 bytes."));
    return;
  }
  if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
  const type = (response.headers.get("content-type") || "").split(";")[0].trim().toLowerCase();
  const partial = response.status === 206 && isTruncated(response.headers.get("content-range"));
  if (RASTER.includes(type)) {
    if (partial) {
      body.replaceChildren("The image is too large to preview; download it.");
      return;
    }
    const blob = await response.blob();
    const image = h("img", {alt: `Artifact version ${version}`, class: "preview-image"});
    image.src = URL.createObjectURL(new Blob([blob], {type}));
    image.addEventListener("load", () => URL.revokeObjectURL(image.src), {once: true});
    body.replaceChildren(image);
    return;
  }
  if (type === "text/plain" || type === "application/json") {
    let text = await response.text();
    if (type === "application/json" && !partial) {
      try {
        text = JSON.stringify(JSON.parse(text), null, 2);
      } catch {
        // Shown as it is.
      }
    }
    body.replaceChildren(h("pre", {class: "preview-text"}, text));
    if (partial) body.append(h("small", {}, `The first ${PREVIEW_BYTES_MAX} bytes; download the rest.`));
    return;
  }
  body.replaceChildren(`Not shown here (${type || "unknown type"}): download it to open it.`);
}

/** Whether a `Content-Range` (`bytes 0-99/1000`) leaves bytes out. */
function isTruncated(contentRange) {
  const match = /bytes (\d+)-(\d+)\/(\d+)/.exec(contentRange || "");
  return !match || Number(match[2]) + 1 < Number(match[3]);
}

// ---------------------------------------------------------------------------------------------
// Session and routing.

const state = {
  user: null,
  /** Where to go after signing in. */
  returnTo: "#/inbox",
  /** What the sign-in page says (why the user is there). */
  signInMessage: "",
  /** The page shown: `{refresh, title}`. */
  page: null,
  /** Bumped on every navigation, so that a late answer for a previous page is dropped. */
  generation: 0,
  pollTimer: null,
  pollDelay: POLL_MS,
  /** The page's open event stream, if any. */
  stream: null,
  /** A refresh running because of an event, and whether another event came meanwhile. */
  cueRunning: false,
  cueAgain: false,
};

function isAdmin() {
  return Boolean(state.user && (state.user.is_admin || state.user.role === "admin"));
}

/** An approver or an admin: sees, and may answer on, everyone's workflows. */
function seesAll() {
  return isAdmin() || Boolean(state.user && state.user.role === "approver");
}

function sessionEnded() {
  if (!state.user) return;
  state.user = null;
  state.signInMessage = "Your session has ended (signed out, expired or revoked). Sign in again.";
  if (!location.hash.startsWith("#/sign-in")) state.returnTo = location.hash || "#/inbox";
  location.hash = "#/sign-in";
}

function showUser() {
  const signedIn = Boolean(state.user);
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("who").hidden = !signedIn;
  document.getElementById("who-email").textContent = signedIn ? state.user.email : "";
  for (const link of document.querySelectorAll("[data-admin]")) link.hidden = !isAdmin();
}

const ROUTES = [
  [/^#\/sign-in$/, signInPage, {public: true}],
  [/^#\/inbox$/, inboxPage, {}],
  [/^#\/workflows$/, workflowsPage, {}],
  [/^#\/workflows\/([A-Za-z0-9._-]{1,128})$/, workflowPage, {}],
  [/^#\/tokens$/, tokensPage, {}],
  [/^#\/account$/, accountPage, {}],
  [/^#\/admin\/users$/, usersPage, {admin: true}],
  [/^#\/admin\/nodes$/, nodesPage, {admin: true}],
  [/^#\/admin\/slots$/, slotsPage, {admin: true}],
];

async function route() {
  const generation = ++state.generation;
  clearTimeout(state.pollTimer);
  closeStream();
  state.page = null;
  state.pollDelay = POLL_MS;
  const hash = location.hash || "#/inbox";
  // The inbox's count is read by the inbox page only: elsewhere it would go stale.
  document.getElementById("inbox-count").textContent = "";
  const found = ROUTES.find(([pattern]) => pattern.test(hash));
  if (!found) {
    location.hash = state.user ? "#/inbox" : "#/sign-in";
    return;
  }
  const [pattern, page, options] = found;
  if (!options.public && !state.user) {
    state.returnTo = hash;
    location.hash = "#/sign-in";
    return;
  }
  if (options.admin && !isAdmin()) {
    say("Only an admin may see that page.", "error");
    location.hash = "#/inbox";
    return;
  }
  for (const link of document.querySelectorAll("[data-nav]")) {
    const here = hash.startsWith(link.getAttribute("href"));
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const main = document.getElementById("main");
  main.replaceChildren(h("p", {class: "loading"}, "Loading…"));
  // What was said about the previous page is stale, unless it led here (a launch, a sign-in).
  if (carried || Date.now() - saidAt > 1500) say("");
  else carried = true;
  try {
    const shown = await page(main, hash.match(pattern).slice(1));
    if (generation !== state.generation) return;
    state.page = shown || null;
    document.title = shown && shown.title ? `${shown.title} · reins` : "reins";
    // A keyboard or screen-reader user lands on the new page, not on the link they left.
    if (!main.contains(document.activeElement)) main.focus({preventScroll: true});
    openStream();
    schedulePoll();
  } catch (error) {
    if (generation !== state.generation || error.status === 401) return;
    main.replaceChildren(h("h1", {}, "Something went wrong"),
      h("p", {class: "error"}, errorText(error)));
  }
}

/** How long the poll waits while nothing fails: long while an event stream does the work. */
function pollBase() {
  const streamed = state.stream && state.stream.readyState === EventSource.OPEN;
  return streamed && !(state.page && state.page.pollAlways) ? POLL_MS_WITH_STREAM : POLL_MS;
}

function schedulePoll() {
  clearTimeout(state.pollTimer);
  if (document.hidden || !state.page || !state.page.refresh) return;
  state.pollTimer = setTimeout(poll, Math.max(state.pollDelay, pollBase()));
}

/** Opens the shown page's event stream; a stream that fails leaves the page to its poll. */
function openStream() {
  closeStream();
  const page = state.page;
  if (!page || !page.events || typeof EventSource !== "function" || document.hidden) return;
  // A stream opened again (the tab was hidden) goes on after the last event the page saw.
  const url = page.resumable && page.lastEventId
    ? `${page.events}?${new URLSearchParams({after: page.lastEventId})}` : page.events;
  const source = new EventSource(url, {withCredentials: true});
  state.stream = source;
  source.addEventListener("open", () => {
    if (state.stream !== source) return;
    document.body.dataset.live = "stream";
    schedulePoll();
  });
  source.addEventListener("error", () => {
    // CONNECTING: the browser tries again by itself. CLOSED: refused (no such stream on this
    // node, too many streams): the poll takes over.
    if (state.stream === source && source.readyState === EventSource.CLOSED) {
      closeStream();
      schedulePoll();
    }
  });
  for (const kind of EVENT_KINDS) {
    source.addEventListener(kind, (event) => {
      if (state.stream !== source) return;
      if (event.lastEventId) page.lastEventId = event.lastEventId;
      if (page.endsWith && page.endsWith(event)) closeStream();
      if (page.onEvent && page.onEvent(event)) return;
      cue();
    });
  }
}

function closeStream() {
  if (state.stream) state.stream.close();
  state.stream = null;
  document.body.dataset.live = "poll";
}

/** Reads the page again for an event; a burst of events costs one read more at most. */
async function cue() {
  if (state.cueRunning) {
    state.cueAgain = true;
    return;
  }
  state.cueRunning = true;
  const page = state.page;
  try {
    do {
      state.cueAgain = false;
      if (page !== state.page) break;
      await page.refresh();
    } while (state.cueAgain);
  } catch (error) {
    if (error.status !== 401) schedulePoll();
  } finally {
    state.cueRunning = false;
  }
}

async function poll() {
  const generation = state.generation;
  const page = state.page;
  if (!page) return;
  try {
    await page.refresh();
    // The last read failed and said so: say that it works again by saying nothing.
    if (state.pollDelay > POLL_MS) say("");
    state.pollDelay = POLL_MS;
  } catch (error) {
    if (error.status === 401) return;
    state.pollDelay = Math.min(Math.max(state.pollDelay, pollBase()) * 2, POLL_MS_MAX);
    say(`Live updates paused: ${errorText(error)}; trying again in ${duration(state.pollDelay / 1000)}.`,
      "error");
  }
  if (generation === state.generation) schedulePoll();
}

/** Reads a page's data again now (after an action), then goes on polling. */
async function refreshNow() {
  if (!state.page) return;
  clearTimeout(state.pollTimer);
  await state.page.refresh(true);
  schedulePoll();
}

// ---------------------------------------------------------------------------------------------
// Pages.

async function signInPage(main) {
  const message = state.signInMessage;
  const email = h("input", {type: "email", name: "username", autocomplete: "username", required: true});
  const password = h("input", {type: "password", name: "password",
    autocomplete: "current-password", required: true});
  const error = h("p", {class: "error", role: "alert"});
  const form = h("form", {class: "card narrow", id: "sign-in"},
    h("h1", {}, "Sign in"),
    message ? h("p", {class: "notice", role: "alert"}, message) : null,
    field("Email", email), field("Password", password), error,
    h("button", {type: "submit", class: "primary"}, "Sign in"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    try {
      await api("POST", "/api/v1/auth/login/local", undefined,
        {form: {username: email.value, password: password.value}, quiet401: true});
      state.user = await api("GET", "/api/v1/auth/me");
      state.signInMessage = "";
      showUser();
      const target = state.returnTo && state.returnTo !== "#/sign-in" ? state.returnTo : "#/inbox";
      state.returnTo = "#/inbox";
      location.hash = target;
    } catch (failure) {
      error.textContent = errorText(failure);
      password.select();
    }
  });
  main.replaceChildren(form);
  showUser();
  email.focus();
  return {title: "Sign in"};
}

async function signOut() {
  try {
    await api("POST", "/api/v1/auth/logout", undefined, {quiet401: true});
  } catch (error) {
    if (error.status !== 401) {
      say(errorText(error), "error");
      return;
    }
  }
  state.user = null;
  state.signInMessage = "You have signed out.";
  state.returnTo = "#/inbox";
  showUser();
  location.hash = "#/sign-in";
}

// The inbox ------------------------------------------------------------------------------------

async function inboxPage(main) {
  const list = h("div", {id: "inbox"});
  const more = h("p", {class: "notice", hidden: true});
  main.replaceChildren(h("h1", {}, "Inbox"),
    h("p", {class: "lead"}, "Everything that waits for you: overdue first, then oldest first."), more, list);
  const previews = new Map();
  let last = null;
  // Status changes come as events; an agent's request does not change a status, so the inbox
  // polls at its usual pace as well.
  const page = {title: "Inbox", events: "/api/v1/events", pollAlways: true};
  page.refresh = async (force) => {
    const inbox = await api("GET", "/api/v1/inbox");
    const count = inbox.items.length;
    document.title = `(${count}${inbox.more ? "+" : ""}) Inbox · reins`;
    page.title = `(${count}${inbox.more ? "+" : ""}) Inbox`;
    document.getElementById("inbox-count").textContent = count ? `(${count})` : "";
    const signature = JSON.stringify(inbox);
    if (!force && signature === last) return;
    last = signature;
    const unreadable = inbox.unreadable || [];
    more.hidden = !inbox.more && unreadable.length === 0;
    more.textContent = [
      inbox.more ? "More workflows wait than the inbox reads at once; answer these first." : "",
      unreadable.length ? `Left out: ${unreadable.length} waiting workflow(s) whose record cannot ` +
        `be read (${unreadable.join(", ")}); an admin finds the reason in the node's log.` : "",
    ].filter(Boolean).join(" ");
    rerender(list, () => count === 0
      ? h("p", {class: "empty"}, "Nothing waits for you.")
      : h("ul", {class: "items"}, inbox.items.map((item) => inboxItem(item, previews))));
  };
  await page.refresh();
  return page;
}

function itemKey(item) {
  return `${item.run_id}/${item.step_id}/${item.attempt}`;
}

function inboxItem(item, previews) {
  const key = itemKey(item);
  const what = {pause: "Paused: resume it", humanCheckpoint: "Checkpoint: approve or reject",
    agent_request: "An agent asks for approval"}[item.kind] || item.kind;
  const li = h("li", {class: "item card", "data-item": key, "data-kind": item.kind},
    h("h2", {}, what, item.overdue
      ? h("span", {class: "badge badge-overdue", "data-overdue": "true"}, "overdue") : ""),
    h("p", {class: "meta"}, "Workflow ", workflowLink(item.run_id, item.title),
      " · step ", h("code", {}, item.step_id), ` · attempt ${item.attempt} · waiting since `,
      time(item.since), item.remind_at != null
        ? h("span", {}, item.overdue ? " · overdue since " : " · reminder at ", time(item.remind_at))
        : "", item.deadline_at != null
        ? h("span", {class: "deadline"}, " · its timeout decides it at ", time(item.deadline_at))
        : ""));
  if (item.recoverable) {
    li.append(h("p", {class: "notice recoverable-warning"},
      "No node runs this workflow (recoverable): an answer is recorded now and applied when a " +
      "node takes it over (Recover, on the workflow's page)."));
  }
  if (item.kind === "humanCheckpoint") {
    if (item.artifact_version != null) {
      const previewKey = `${item.run_id}/${item.artifact_version}`;
      if (!previews.has(previewKey)) {
        previews.set(previewKey, artifactPreview(item.run_id, item.artifact_version));
      }
      li.append(previews.get(previewKey));
    }
    li.append(decideForm(item.run_id, item.step_id, item.attempt, item.artifact_version));
  } else if (item.kind === "pause") {
    if (item.message) li.append(h("p", {class: "pause-message"}, item.message));
    li.append(resumeForm(item.run_id, item.step_id, item.attempt, item.fingerprint));
  } else if (item.kind === "agent_request" && item.approval) {
    li.append(h("p", {}, "It asks to do:"), actionsView(item.approval.actions),
      answerForm(item.run_id, item.step_id, item.approval.request_id));
  }
  return li;
}

function commentField(key) {
  return field("Comment (optional)", h("textarea", {rows: 2, "data-keep": `comment/${key}`,
    name: "comment"}));
}

function decideForm(runId, stepId, attempt, version) {
  const key = `decide/${runId}/${stepId}/${attempt}`;
  const comment = commentField(key);
  const send = (decision) => async () => {
    const text = comment.querySelector("textarea").value.trim();
    const body = {step_id: stepId, attempt, artifact_version: version, decision};
    if (text) body.comment = text;
    await api("POST", `${workflowPath(runId)}/decide`, body);
    say(`${decision === "approve" ? "Approved" : "Rejected"} ${stepId} of ${runId}.`, "ok");
    await refreshNow();
  };
  return h("div", {class: "decide"}, comment, h("div", {class: "buttons"},
    actionButton("Approve", send("approve"), {class: "primary", "data-action": "approve"}),
    actionButton("Reject", send("reject"), {class: "danger", "data-action": "reject"})));
}

function answerForm(runId, stepId, requestId) {
  const key = `answer/${runId}/${stepId}/${requestId}`;
  const comment = commentField(key);
  const send = (decision) => async () => {
    const text = comment.querySelector("textarea").value.trim();
    const body = {decision, request_id: requestId};
    if (text) body.comment = text;
    await api("POST", `${workflowPath(runId)}/steps/${encodeURIComponent(stepId)}/answer`, body);
    say(`${decision === "approve" ? "Approved" : "Rejected"} the request of ${stepId}.`, "ok");
    await refreshNow();
  };
  return h("div", {class: "answer"}, comment, h("div", {class: "buttons"},
    actionButton("Approve", send("approve"), {class: "primary", "data-action": "approve"}),
    actionButton("Reject", send("reject"), {class: "danger", "data-action": "reject"})));
}

function resumeForm(runId, stepId, attempt, fingerprint) {
  const input = h("textarea", {rows: 2, "data-keep": `resume/${runId}/${stepId}/${attempt}`,
    name: "input", spellcheck: "false"});
  const send = async () => {
    let value = null;
    if (input.value.trim()) {
      try {
        value = JSON.parse(input.value);
      } catch (error) {
        throw new Error(`the input is not JSON: ${errorText(error)}`);
      }
    }
    await api("POST", `${workflowPath(runId)}/resume`,
      {fingerprint, step_id: stepId, attempt, input: value});
    say(`Resumed ${stepId} of ${runId}.`, "ok");
    await refreshNow();
  };
  return h("div", {class: "resume"},
    field("Input for the script (JSON, optional)", input),
    h("div", {class: "buttons"}, actionButton("Resume", send, {class: "primary",
      "data-action": "resume"})));
}

/** An event id nobody used: the form's default, which a person may replace with their own. */
function freshEventId() {
  return `console-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
}

/**
 * Sends an event to a workflow that waits for one, as `reins send` does: its name (the one it
 * waits for unless changed), a JSON payload (none: `null`) and an event id (the same id again
 * delivers it once). The API's refusal is shown in the status line.
 */
function sendEventForm(runId, names) {
  const key = `event/${runId}`;
  const name = h("input", {type: "text", name: "name", value: names[0], required: true,
    autocomplete: "off", spellcheck: "false", "data-keep": `${key}/name`});
  const payload = h("textarea", {rows: 3, name: "payload", spellcheck: "false",
    "data-keep": `${key}/payload`});
  const eventId = h("input", {type: "text", name: "event_id", value: freshEventId(),
    required: true, autocomplete: "off", spellcheck: "false", "data-keep": `${key}/id`});
  const form = h("form", {class: "send-event"},
    field("Event name", name, names.length > 1 ? `It waits for ${names.join(", ")}.` : null),
    field("Payload (JSON, what its wait resolves to; {} when left empty, never null)", payload),
    field("Event id (sent again with the same id, it is delivered once)", eventId),
    h("div", {class: "buttons"}, h("button", {type: "submit", class: "primary",
      "data-action": "send-event"}, "Send event")));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      // An event never carries null (what a wait resolves to when its deadline passes).
      let value = {};
      if (payload.value.trim()) {
        try {
          value = JSON.parse(payload.value);
        } catch (error) {
          throw new Error(`the payload is not JSON: ${errorText(error)}`);
        }
      }
      const sent = await api("POST", `${workflowPath(runId)}/events`,
        {name: name.value.trim(), event_id: eventId.value.trim(), payload: value});
      say(sent.repeated ? `Event ${sent.event_id} was sent before: it is delivered once.`
        : `Sent event ${sent.name} (${sent.event_id}).`, "ok");
      // The next event needs an id of its own.
      eventId.value = freshEventId();
      payload.value = "";
      await refreshNow();
    } catch (error) {
      if (error.status !== 401) say(errorText(error), "error");
    } finally {
      button.disabled = false;
    }
  });
  return h("section", {class: "card", id: "send-event"}, h("h2", {}, "Send event"), form);
}

// The workflows list ---------------------------------------------------------------------------

/** The list's filters and where it is: `cursors[i]` is the `after` of page i (newest first). */
const listFilters = {status: "", waiting: "", owner: "", page: 0, cursors: [null]};

async function workflowsPage(main) {
  const search = h("input", {type: "search", placeholder: "a run id or request id",
    "data-keep": "search", autocomplete: "off"});
  const status = h("select", {}, h("option", {value: ""}, "any"),
    [...STATUSES, ...SHOWN].map((s) => h("option", {value: s}, s)));
  status.value = listFilters.status;
  const waiting = h("select", {name: "waiting_for"}, h("option", {value: ""}, "anything or nothing"),
    WAIT_KINDS.map((kind) => h("option", {value: kind}, kind)));
  waiting.value = listFilters.waiting;
  const owner = h("select", {}, h("option", {value: ""}, "anyone"));
  let emails = new Map();
  if (isAdmin()) {
    try {
      const users = await api("GET", "/api/v1/auth/users");
      emails = new Map(users.users.map((u) => [u.id, u.email]));
      for (const [id, email] of emails) owner.append(h("option", {value: id}, email));
      owner.value = listFilters.owner;
    } catch {
      // Without the users list there is no owner filter to offer.
    }
  }
  const find = h("form", {class: "search", role: "search"}, field("Find a workflow", search),
    h("button", {type: "submit"}, "Open"));
  find.addEventListener("submit", async (event) => {
    event.preventDefault();
    const id = search.value.trim();
    if (!/^[A-Za-z0-9._-]{1,128}$/.test(id)) {
      say(`${JSON.stringify(id)} is neither a run id nor a request id`, "error");
      return;
    }
    try {
      const runId = await findWorkflow(id);
      if (runId) location.hash = `#/workflows/${runId}`;
      else say(`No workflow has the run id or request id ${JSON.stringify(id)}.`, "error");
    } catch (error) {
      if (error.status !== 401) say(errorText(error), "error");
    }
  });
  const filters = h("div", {class: "filters"}, field("Status", status),
    field("Waiting for", waiting),
    isAdmin() && emails.size ? field("Owner", owner) : null);
  const table = h("div", {id: "workflows"});
  main.replaceChildren(h("h1", {}, "Workflows"), h("div", {class: "toolbar"}, find, filters),
    launchForm(), table);
  let last = null;
  const move = (by) => async () => {
    listFilters.page += by;
    await refreshNow();
  };
  const draw = (rows, {newer, older, count}) => {
    const now = Date.now() / 1000;
    const pager = h("nav", {class: "pager", "aria-label": "Pages"},
      actionButton("Newer", move(-1), {disabled: !newer}),
      h("span", {}, count), actionButton("Older", move(1), {disabled: !older}));
    rerender(table, () => rows.length === 0 ? h("p", {class: "empty"}, "No workflows.") : [
      h("table", {class: "list"},
        h("thead", {}, h("tr", {}, h("th", {scope: "col"}, "Run"), h("th", {scope: "col"}, "Status"),
          isAdmin() ? h("th", {scope: "col"}, "Owner") : null, h("th", {scope: "col"}, "Started"),
          h("th", {scope: "col"}, "Updated"))),
        h("tbody", {}, rows.map((w) => h("tr", {"data-run": w.run_id},
          h("td", {"data-label": "Run"}, workflowLink(w.run_id, w.title)),
          h("td", {"data-label": "Status"}, badge(w.status), waitsView(w.waiting_for, now)),
          isAdmin() ? h("td", {"data-label": "Owner"}, ownerName(w.user_id, emails)) : null,
          h("td", {"data-label": "Started"}, time(w.created_at)),
          h("td", {"data-label": "Updated"}, time(w.updated_at)))))),
      pager]);
  };
  const query = (after) => {
    const q = new URLSearchParams({limit: String(LIST_PAGE_SIZE)});
    if (listFilters.status) q.set("status", listFilters.status);
    if (listFilters.waiting) q.set("waiting_for", listFilters.waiting);
    if (listFilters.owner) q.set("user_id", listFilters.owner);
    if (after) q.set("after", after);
    return `/api/v1/workflows?${q}`;
  };
  const page = {title: "Workflows", events: "/api/v1/events"};
  page.refresh = async (force) => {
    listFilters.page = Math.max(0, Math.min(listFilters.page, listFilters.cursors.length - 1));
    const answer = await api("GET", query(listFilters.cursors[listFilters.page]));
    listFilters.cursors.length = listFilters.page + 1;
    if (answer.next) listFilters.cursors.push(answer.next);
    const where = {newer: listFilters.page > 0, older: Boolean(answer.next),
      count: `Page ${listFilters.page + 1}`};
    const signature = JSON.stringify([answer.workflows, where]);
    if (!force && signature === last) {
      for (const w of answer.workflows) {
        updateWaits(table.querySelector(`tr[data-run="${w.run_id}"] .waiting-for`), w.waiting_for);
      }
      return;
    }
    last = signature;
    draw(answer.workflows, where);
  };
  const restart = async () => {
    listFilters.page = 0;
    listFilters.cursors = [null];
    await refreshNow();
  };
  status.addEventListener("change", async () => {
    listFilters.status = status.value;
    await restart();
  });
  waiting.addEventListener("change", async () => {
    listFilters.waiting = waiting.value;
    await restart();
  });
  owner.addEventListener("change", async () => {
    listFilters.owner = owner.value;
    await restart();
  });
  await page.refresh();
  return page;
}

/**
 * The run id `id` names: a workflow with that run id, or else the caller's (or, for an admin,
 * anyone's) newest workflow launched with that request id. `null` when there is none.
 */
async function findWorkflow(id) {
  try {
    await api("GET", workflowPath(id));
    return id;
  } catch (error) {
    if (error.status !== 404) throw error;
  }
  const answer = await api("GET", `/api/v1/workflows?${new URLSearchParams({request_id: id,
    limit: "1"})}`);
  return answer.workflows.length ? answer.workflows[0].run_id : null;
}

/** A workflow's owner as people know them: "you", their email, or their id. */
function ownerName(userId, emails) {
  if (state.user && userId === state.user.id) return "you";
  return emails.get(userId) || userId;
}

function launchForm() {
  const script = h("textarea", {rows: 8, spellcheck: "false", name: "script", required: true,
    "data-keep": "launch-script"});
  const args = h("textarea", {rows: 2, spellcheck: "false", name: "args", "data-keep": "launch-args"});
  const requestId = h("input", {type: "text", name: "request_id", autocomplete: "off"});
  const title = h("input", {type: "text", name: "title", autocomplete: "off"});
  const form = h("form", {class: "launch"},
    field("Title (optional; what people will know it by)", title),
    field("Script (the body of an async function)", script),
    field("Arguments (JSON, optional)", args),
    field("Request id (optional; the same id never launches twice)", requestId),
    h("button", {type: "submit", class: "primary"}, "Launch"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const body = {script: script.value};
      if (args.value.trim()) {
        try {
          body.args = JSON.parse(args.value);
        } catch (error) {
          throw new Error(`the arguments are not JSON: ${errorText(error)}`);
        }
      }
      if (requestId.value.trim()) body.request_id = requestId.value.trim();
      if (title.value.trim()) body.title = title.value.trim();
      const launched = await api("POST", "/api/v1/workflows", body);
      say(`Launched ${launched.run_id}.`, "ok");
      location.hash = `#/workflows/${launched.run_id}`;
    } catch (error) {
      if (error.status !== 401) say(errorText(error), "error");
    }
  });
  return h("details", {class: "card"}, h("summary", {}, "Launch a workflow"), form);
}

// One workflow ---------------------------------------------------------------------------------

async function workflowPage(main, [runId]) {
  const region = h("div", {id: "workflow"});
  // The script's console.log lines come as `log` events of its stream (replayed from the first
  // when the page opens it), so they are kept apart from what each read of the record draws.
  const logLines = h("pre", {class: "logs"});
  const logs = h("section", {class: "card", id: "logs", hidden: true},
    h("h2", {}, "console.log"), logLines);
  main.replaceChildren(h("p", {class: "crumbs"}, h("a", {href: "#/workflows"}, "Workflows"), " / ",
    h("span", {}, runId)), region, logs);
  const previews = new Map();
  const logged = new Set();
  // Pages of steps and of artifact versions to show; the "More" buttons raise them.
  const wanted = {stepPages: STEP_PAGES_SHOWN, artifactPages: 1};
  const more = (what) => {
    wanted[what] += what === "stepPages" ? STEP_PAGES_SHOWN : 1;
    page.refresh(true).catch((error) => say(errorText(error), "error"));
  };
  let last = null;
  const page = {
    title: `Workflow ${runId}`,
    events: `${workflowPath(runId)}/events`,
    resumable: true,
    // The stream ends after the final status; without this the browser would open it again.
    endsWith: (event) => event.type === "status" && TERMINAL.has(statusOf(event)),
    /** Takes a `log` event; answers whether the event changes nothing else on the page. */
    onEvent: (event) => {
      if (event.type !== "log" && event.type !== "log_truncated") return false;
      if (logged.has(event.lastEventId)) return true;
      logged.add(event.lastEventId);
      let data = {};
      try {
        data = JSON.parse(event.data);
      } catch {
        return true;
      }
      const line = event.type === "log" ? String(data.line)
        : "(later lines are over the workflow's log bounds: in the node's log only)";
      logLines.append(logLines.textContent ? `\n${line}` : line);
      logs.hidden = false;
      return true;
    },
  };
  page.refresh = async (force) => {
    let record;
    try {
      record = await withPages(await api("GET", workflowPath(runId)), wanted);
    } catch (error) {
      if (error.status === 404) {
        last = null;
        rerender(region, () => h("p", {class: "error"}, errorText(error)));
        return;
      }
      throw error;
    }
    const signature = JSON.stringify(record);
    if (!force && signature === last) {
      updateRunningTimes(region, record);
      return;
    }
    last = signature;
    // The tab reads the title people know it by, with the run id beside it, as text.
    page.title = record.title ? `${record.title} (${runId})` : `Workflow ${runId}`;
    if (state.page === page || state.page === null) document.title = `${page.title} · reins`;
    rerender(region, () => renderWorkflow(record, previews, more));
  };
  await page.refresh();
  return page;
}

/**
 * The record with the pages of steps and artifact versions `wanted` asks for: the record holds
 * the first of each, and `steps_next` and `artifacts_next` lead to the next ones.
 */
async function withPages(record, wanted) {
  const path = workflowPath(record.run_id);
  for (let pages = 1; pages < wanted.stepPages && record.steps_next != null; pages++) {
    const page = await api("GET", `${path}/steps?after=${encodeURIComponent(record.steps_next)}`);
    record.steps.push(...page.steps);
    record.steps_next = page.next;
  }
  for (let pages = 1; pages < wanted.artifactPages && record.artifacts_next != null; pages++) {
    const page = await api("GET", `${path}/artifacts?after=${record.artifacts_next}`);
    record.artifacts.push(...page.artifacts);
    record.artifacts_next = page.next;
  }
  return record;
}

/** The status an event's JSON data names, if any. */
function statusOf(event) {
  try {
    return JSON.parse(event.data).status;
  } catch {
    return undefined;
  }
}

function renderWorkflow(record, previews, more) {
  const mine = state.user && record.user_id === state.user.id;
  const admin = isAdmin();
  const now = Date.now() / 1000;
  const header = h("header", {class: "workflow-head"},
    record.title ? [h("h1", {id: "workflow-title"}, record.title),
      h("p", {class: "meta"}, "Workflow ", h("code", {}, record.run_id))]
      : h("h1", {}, "Workflow ", h("code", {}, record.run_id)),
    h("p", {class: "meta"}, "Status ", h("span", {id: "workflow-status"}, badge(record.status)),
      " · started ", time(record.created_at), " · updated ", time(record.updated_at),
      LIVE.has(record.status) ? null
        : ` · took ${duration(record.updated_at - record.created_at)}`),
    waitsView(record.waiting_for, now, {id: "waiting-for", "aria-label": "What it waits for"}),
    seesAll() && !mine ? h("p", {class: "meta"}, `Owner: ${ownerName(record.user_id, new Map())}`)
      : null,
    record.retry_of ? h("p", {class: "meta", id: "retry-of"}, "Retry of ",
      h("a", {href: `#/workflows/${record.retry_of}`}, record.retry_of),
      " (it runs again from that workflow's failed step)") : null,
    record.retried_by ? h("p", {class: "meta", id: "retried-by"}, "Retried as ",
      h("a", {href: `#/workflows/${record.retried_by}`}, record.retried_by),
      " (which runs again from this workflow's failed step)") : null);

  const actions = h("div", {class: "buttons actions"});
  const act = (label, path, body) => actionButton(label, async () => {
    const answer = await api("POST", `${workflowPath(record.run_id)}/${path}`, body);
    say(`${label}: the workflow is ${answer.status}.`, "ok");
    await refreshNow();
  }, {"data-action": path});
  if (LIVE.has(record.stored_status) && record.stored_status !== "cancelling" && (mine || admin)) {
    actions.append(act("Cancel", "cancel"));
  }
  if (record.recoverable && (mine || admin)) actions.append(act("Recover", "recover"));
  if (record.stored_status === "failed" && !record.retried_by && (mine || admin)) {
    // A new workflow: the steps before the failed one are kept, the rest runs again.
    actions.append(actionButton("Retry from the failed step", async () => {
      const retried = await api("POST", `${workflowPath(record.run_id)}/retry`, {});
      say(`Retried as ${retried.run_id}.`, "ok");
      location.hash = `#/workflows/${retried.run_id}`;
    }, {"data-action": "retry"}));
  }
  if (TERMINAL.has(record.status) && (mine || admin)) {
    actions.append(confirmButton("Delete", "Delete this workflow and everything it holds?",
      async () => {
        await api("DELETE", workflowPath(record.run_id));
        say(`Deleted ${record.run_id}.`, "ok");
        location.hash = "#/workflows";
      }));
  }

  const parts = [header, actions];
  const events = (record.waiting_for || []).filter((wait) => wait.kind === "event");
  if (events.length && answerable(record) && (mine || admin)) {
    parts.push(sendEventForm(record.run_id, [...new Set(events.map((wait) => wait.name))]));
  }
  if (record.error) parts.push(h("section", {class: "card error-box"}, h("h2", {}, "Error"),
    h("pre", {class: "error-text"}, record.error)));
  if (record.reconciliation) parts.push(reconcilePanel(record, admin));
  if (record.result !== undefined && record.result !== null) {
    parts.push(h("section", {class: "card"}, h("h2", {}, "Result"), json(record.result)));
  }

  // With steps not read yet, a checkpoint after the last one read would show out of its place:
  // only those before it show, and those that wait for an answer.
  const lastStep = record.steps.length ? record.steps[record.steps.length - 1].started_at : -1;
  const checkpoints = record.steps_next == null ? record.checkpoints
    : record.checkpoints.filter((c) => c.status === "waiting" || c.started_at <= lastStep);
  const entries = [
    ...record.steps.map((step) => ({at: step.started_at, node: stepEntry(record, step, now, previews)})),
    ...checkpoints.map((c) => ({at: c.started_at, node: checkpointEntry(record, c, previews)})),
  ].sort((a, b) => a.at - b.at);
  parts.push(h("section", {class: "timeline-box"}, h("h2", {}, "Timeline"),
    entries.length ? h("ol", {class: "timeline"}, entries.map((e) => e.node))
      : h("p", {class: "empty"}, "No steps yet."),
    record.steps_next == null ? null
      : h("div", {class: "buttons"}, h("p", {class: "meta"},
        `The first ${record.steps.length} steps; more follow.`),
      h("button", {type: "button", id: "more-steps", onclick: () => more("stepPages")},
        "More steps"))));

  if (record.artifacts.length) {
    parts.push(h("section", {class: "artifacts"}, h("h2", {}, "Artifacts"),
      record.artifacts.map((a) => preview(previews, record.run_id, a.version, "list", a)),
      record.artifacts_next == null ? null
        : h("button", {type: "button", id: "more-artifacts",
          onclick: () => more("artifactPages")}, "More artifacts")));
  }
  parts.push(h("details", {class: "card"}, h("summary", {}, "Script and arguments"),
    h("pre", {class: "script"}, record.script), json(record.args)));
  return parts;
}

/** A cached preview element: artifacts never change, so each is fetched once per page. */
function preview(previews, runId, version, purpose = "list", about = null) {
  const key = `${purpose}/${runId}/${version}`;
  if (!previews.has(key)) previews.set(key, artifactPreview(runId, version, about));
  return previews.get(key);
}

/** Step statuses after which an attempt no longer counts time, with or without an outcome. */
const STEP_ENDED = new Set(["completed", "failed", "cancelled", "needs_reconciliation"]);

/**
 * What an attempt took, the wait before it (its retry's backoff, a slot) apart from its run:
 * "waited 2.0 s · ran 12 ms"; while it runs, "running for ..." counting from its run's start.
 * An attempt that ended without an outcome (cancelled) stops counting.
 */
function attemptTimes(step, now) {
  const ended = STEP_ENDED.has(step.status) || typeof step.finished_at === "number";
  const parts = [];
  if (step.waited_ms > 0) parts.push(`waited ${duration(step.waited_ms / 1000)}`);
  if (typeof step.ran_ms === "number") {
    parts.push(`ran ${duration(step.ran_ms / 1000)}`);
    return parts.join(" · ");
  }
  if (step.status === "needs_reconciliation") {
    parts.push("its outcome is unknown: an operator reconciles it");
    return parts.join(" · ");
  }
  if (ended) {
    parts.push(typeof step.run_started_at === "number" ? "ended" : "ended before it ran");
    return parts.join(" · ");
  }
  if (typeof step.run_started_at !== "number") {
    return step.retry ? ["waiting for its retry", ...parts].join(" · ") : "waiting for a slot";
  }
  return [...parts.flatMap((part) => [part, " · "]),
    h("span", {class: "running-for", "data-since": step.run_started_at},
      `running for ${duration(now - step.run_started_at)}`)];
}

function stepEntry(record, step, now, previews) {
  const times = attemptTimes(step, now);
  const retryOf = step.attempt > 1 ? ` (retry of ${step.attempt - 1})` : "";
  const li = h("li", {class: `entry entry-${step.status}`, "data-step": step.step_id,
    "data-attempt": String(step.attempt)},
    h("div", {class: "entry-head"}, h("strong", {}, step.step_id), " ",
      h("span", {class: "kind"}, step.kind), " · ",
      h("span", {class: "attempt"}, `Attempt ${step.attempt}${retryOf}`), " ", badge(step.status)),
    h("p", {class: "meta"}, "journaled ", time(step.started_at), " · ",
      h("span", {class: "took"}, times)));
  if (step.output !== undefined && step.output !== null) {
    li.append(h("div", {class: "output"}, h("h3", {}, "Output"), json(step.output)));
  }
  if (step.error) {
    const how = step.error_status && step.error_status !== "error" ? ` (${step.error_status})` : "";
    li.append(h("pre", {class: "error-text"}, step.error + how));
  }
  if (step.retry) {
    li.append(h("p", {class: "meta retry"}, `Retry of attempt ${step.attempt - 1}, due `,
      time(step.retry.due_at), ", after: ", h("span", {class: "retry-reason"}, step.retry.reason)));
  }
  if (step.reconciled) {
    const r = step.reconciled;
    li.append(h("p", {class: "meta reconciled"}, `Reconciled by ${r.by} (${r.resolution}): `,
      h("q", {class: "reconcile-reason"}, r.reason)));
  }
  if (step.approval) {
    const approval = step.approval;
    li.append(h("div", {class: "approval"}, h("h3", {}, "The agent asked to do"),
      actionsView(approval.actions),
      approvalState(record, step, approval)));
  }
  if (step.artifact_version != null) {
    const what = {captureArtifact: "Captured as artifact version",
      readArtifact: "Read artifact version"}[step.kind] || "Output kept as artifact version";
    li.append(h("p", {class: "meta"}, `${what} ${step.artifact_version}.`));
  }
  return li;
}

/** Whether people may still act on the workflow's questions (it runs, or waits for them). */
function answerable(record) {
  return LIVE.has(record.status) && record.stored_status !== "cancelling";
}

/** An agent's request: its answer, the form to answer it, or that nobody can any more. */
function approvalState(record, step, approval) {
  if (approval.status !== "waiting") {
    const answer = approval.answer || {};
    const decided = {approve: "Approved", reject: "Rejected"}[answer.decision] || "Answered";
    return h("div", {class: "answered"}, h("p", {class: "meta"}, decided,
      answer.by ? ` by ${answer.by}` : null),
    answer.comment ? h("p", {class: "meta"}, "Comment: ", h("q", {class: "comment"}, answer.comment))
      : null);
  }
  if (!answerable(record)) return h("p", {class: "meta"}, "Never answered.");
  return answerForm(record.run_id, step.step_id, approval.request_id);
}

function checkpointEntry(record, checkpoint, previews) {
  // A question the workflow ended without: nobody can answer it any more.
  const status = checkpoint.status === "waiting" && !answerable(record) ? "unanswered"
    : checkpoint.status;
  const li = h("li", {class: `entry entry-${status}`, "data-step": checkpoint.step_id},
    h("div", {class: "entry-head"}, h("strong", {}, checkpoint.step_id), " ",
      h("span", {class: "kind"}, checkpoint.kind), ` · attempt ${checkpoint.attempt} `,
      badge(status)),
    h("p", {class: "meta"}, status === "waiting" ? "waiting since " : "asked ",
      time(checkpoint.started_at),
      checkpoint.decided_at ? [" · decided ", time(checkpoint.decided_at),
        ` after ${duration(checkpoint.decided_at - checkpoint.started_at)}`] : null,
      checkpoint.decided_by ? ` by ${checkpoint.decided_by}` : null));
  if (checkpoint.message) li.append(h("p", {class: "pause-message"}, checkpoint.message));
  if (checkpoint.comment) {
    li.append(h("p", {class: "meta"}, "Comment: ", h("q", {class: "comment"}, checkpoint.comment)));
  }
  if (status !== "waiting") return li;
  if (checkpoint.kind === "humanCheckpoint") {
    if (checkpoint.artifact_version != null) {
      li.append(preview(previews, record.run_id, checkpoint.artifact_version, "checkpoint"));
    }
    li.append(decideForm(record.run_id, checkpoint.step_id, checkpoint.attempt,
      checkpoint.artifact_version));
  } else {
    li.append(resumeForm(record.run_id, checkpoint.step_id, checkpoint.attempt,
      record.fingerprint));
  }
  return li;
}

/** Moves the "running for" durations on without drawing the page again. */
function updateRunningTimes(region, record) {
  const now = Date.now() / 1000;
  for (const span of region.querySelectorAll(".running-for")) {
    const since = Number(span.dataset.since);
    // A step's span is drawn only while it runs; a workflow that ended stops them all.
    if (LIVE.has(record.status)) span.textContent = `running for ${duration(now - since)}`;
  }
  updateWaits(region.querySelector("#waiting-for"), record.waiting_for);
}

/** Moves a drawn `waitsView`'s "in 2 h 10 min" on without drawing the page again. */
function updateWaits(list, waits) {
  if (!list || !waits) return;
  const now = Date.now() / 1000;
  list.querySelectorAll("li").forEach((item, i) => {
    if (waits[i]) item.textContent = waitLine(waits[i], now);
  });
}

function reconcilePanel(record, admin) {
  const why = record.reconciliation;
  const box = h("section", {class: "card notice-box"}, h("h2", {}, "Needs reconciliation"),
    h("p", {}, why.message), h("p", {class: "meta"}, `Reason ${why.reason} · step `,
      h("code", {}, why.step_id), " · child run ", h("code", {}, why.run_id)));
  if (!admin) {
    box.append(h("p", {}, "An admin settles it after checking what the child run did."));
    return box;
  }
  const resolution = h("select", {name: "resolution"}, ["retry", "fail", "complete"].map((r) =>
    h("option", {value: r}, r)));
  const output = h("textarea", {rows: 2, name: "output", spellcheck: "false",
    "data-keep": "reconcile-output"});
  const reason = h("input", {type: "text", name: "reason", required: true, "data-keep": "reconcile-reason"});
  const form = h("form", {class: "reconcile"}, field("Resolution", resolution),
    field("Output (JSON, for complete)", output), field("What you checked", reason),
    h("button", {type: "submit", class: "primary"}, "Reconcile"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const body = {step_id: why.step_id, resolution: resolution.value, reason: reason.value};
      if (resolution.value === "complete") {
        try {
          body.output = output.value.trim() ? JSON.parse(output.value) : null;
        } catch (error) {
          throw new Error(`the output is not JSON: ${errorText(error)}`);
        }
      }
      const answer = await api("POST", `${workflowPath(record.run_id)}/reconcile`, body);
      say(`Reconciled: the workflow is ${answer.status}.`, "ok");
      await refreshNow();
    } catch (error) {
      if (error.status !== 401) say(errorText(error), "error");
    }
  });
  box.append(form);
  return box;
}

// API tokens -----------------------------------------------------------------------------------

async function tokensPage(main) {
  const list = h("div", {id: "tokens"});
  const secret = h("div", {class: "secret", "aria-live": "polite"});
  const name = h("input", {type: "text", name: "name", required: true, maxlength: 100});
  const days = h("input", {type: "number", name: "expires_in_days", min: 1, inputmode: "numeric"});
  const form = h("form", {class: "card"}, h("h2", {}, "New token"), field("Name", name),
    field("Expires after days (optional)", days), h("button", {type: "submit", class: "primary"},
      "Create"));
  main.replaceChildren(h("h1", {}, "API tokens"),
    h("p", {class: "lead"}, "Tokens let programs and the CLI act as you (Authorization: Bearer)."),
    form, secret, list);
  const page = {title: "API tokens"};
  page.refresh = async () => {
    const answer = await api("GET", "/api/v1/auth/tokens");
    rerender(list, () => answer.tokens.length === 0 ? h("p", {class: "empty"}, "No tokens.")
      : h("table", {class: "list"}, h("thead", {}, h("tr", {}, ["Name", "Created", "Expires",
        "State", ""].map((t) => h("th", {scope: "col"}, t)))),
      h("tbody", {}, answer.tokens.map((t) => h("tr", {"data-token": t.id},
        h("td", {"data-label": "Name"}, t.name), h("td", {"data-label": "Created"}, time(t.created_at)),
        h("td", {"data-label": "Expires"}, t.expires_at ? time(t.expires_at) : "never"),
        h("td", {"data-label": "State"}, t.revoked ? "revoked" : "active"),
        h("td", {}, t.revoked ? null : confirmButton("Revoke", "Revoke this token?", async () => {
          await api("DELETE", `/api/v1/auth/tokens/${encodeURIComponent(t.id)}`);
          say(`Revoked ${t.name}.`, "ok");
          await refreshNow();
        })))))));
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const body = {name: name.value};
      if (days.value) body.expires_in_days = Number(days.value);
      const created = await api("POST", "/api/v1/auth/tokens", body);
      secret.replaceChildren(h("div", {class: "card notice-box"},
        h("p", {}, `The token ${created.name}; copy it now, it is not shown again:`),
        h("code", {class: "token"}, created.token)));
      name.value = "";
      days.value = "";
      await refreshNow();
    } catch (error) {
      if (error.status !== 401) say(errorText(error), "error");
    }
  });
  await page.refresh();
  return page;
}

// The account ----------------------------------------------------------------------------------

async function accountPage(main) {
  const current = h("input", {type: "password", autocomplete: "current-password", required: true});
  const fresh = h("input", {type: "password", autocomplete: "new-password", required: true});
  const form = h("form", {class: "card"}, h("h2", {}, "Change your password"),
    field("Current password", current), field("New password", fresh),
    h("button", {type: "submit", class: "primary"}, "Change"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await api("POST", "/api/v1/auth/me/password",
        {current_password: current.value, new_password: fresh.value});
      current.value = "";
      fresh.value = "";
      say("Your password is changed; your other sessions have ended.", "ok");
    } catch (error) {
      if (error.status !== 401) say(errorText(error), "error");
    }
  });
  const everywhere = h("section", {class: "card"}, h("h2", {}, "Sign out everywhere"),
    h("p", {}, "Ends every session of yours, this one too. API tokens stay valid."),
    confirmButton("Sign out everywhere", "End every session?", async () => {
      await api("POST", "/api/v1/auth/sign-out-everywhere");
      state.user = null;
      state.signInMessage = "You have signed out everywhere.";
      showUser();
      location.hash = "#/sign-in";
    }));
  main.replaceChildren(h("h1", {}, "Account"),
    h("p", {class: "lead"}, `Signed in as ${state.user.email}.`), form, everywhere);
  return {title: "Account"};
}

// Admin: users ---------------------------------------------------------------------------------

const ROLES = ["user", "approver", "admin"];

async function usersPage(main) {
  const list = h("div", {id: "users"});
  const email = h("input", {type: "email", name: "email", required: true, autocomplete: "off"});
  const password = h("input", {type: "password", name: "password", required: true,
    autocomplete: "new-password"});
  const role = h("select", {name: "role"}, ROLES.map((r) => h("option", {value: r}, r)));
  const form = h("form", {class: "card", id: "new-user"}, h("h2", {}, "New user"),
    field("Email", email),
    field("Password", password), field("Role", role),
    h("button", {type: "submit", class: "primary"}, "Create"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await api("POST", "/api/v1/auth/users",
        {email: email.value, password: password.value, role: role.value});
      say(`Created ${email.value}.`, "ok");
      email.value = "";
      password.value = "";
      await refreshNow();
    } catch (error) {
      if (error.status !== 401) say(errorText(error), "error");
    }
  });
  main.replaceChildren(h("h1", {}, "Users"), form, list);
  const page = {title: "Users"};
  let last = null;
  page.refresh = async (force) => {
    const answer = await api("GET", "/api/v1/auth/users");
    const signature = JSON.stringify(answer);
    if (!force && signature === last) return;
    last = signature;
    rerender(list, () => h("ul", {class: "items"}, answer.users.map(userCard)));
  };
  await page.refresh();
  return page;
}

function userCard(user) {
  const path = `/api/v1/auth/users/${encodeURIComponent(user.id)}`;
  const role = h("select", {name: "role", "data-keep": `role/${user.id}`}, ROLES.map((r) =>
    h("option", {value: r}, r)));
  role.value = user.role || (user.is_admin ? "admin" : "user");
  const password = h("input", {type: "password", name: "password", autocomplete: "new-password",
    "data-keep": `password/${user.id}`});
  const done = (what) => async () => {
    say(`${what}: ${user.email}.`, "ok");
    await refreshNow();
  };
  return h("li", {class: "card item", "data-user": user.id},
    h("h2", {}, user.email, " ", user.disabled ? badge("disabled") : null,
      state.user && user.id === state.user.id ? h("span", {class: "kind"}, " (you)") : null),
    h("p", {class: "meta"}, `Created `, time(user.created_at), " · last sign-in ",
      user.last_login_at ? time(user.last_login_at) : "never"),
    h("div", {class: "row"}, field("Role", role), actionButton("Save role", async () => {
      await api("PATCH", path, {role: role.value});
      await done("Role saved")();
    }, {"data-action": "role"})),
    h("div", {class: "row"}, field("New password", password), actionButton("Reset password",
      async () => {
        await api("POST", `${path}/password`, {password: password.value});
        password.value = "";
        await done("Password reset; their sessions ended")();
      }, {"data-action": "password"})),
    h("div", {class: "buttons"},
      actionButton(user.disabled ? "Enable" : "Disable", async () => {
        await api("PATCH", path, {disabled: !user.disabled});
        await done(user.disabled ? "Enabled" : "Disabled")();
      }, {"data-action": user.disabled ? "enable" : "disable"}),
      actionButton("Sign out everywhere", async () => {
        await api("POST", `${path}/sign-out`);
        await done("Signed out everywhere")();
      }, {"data-action": "sign-out"}),
      confirmButton("Delete", `Delete ${user.email}?`, async () => {
        await api("DELETE", path);
        await done("Deleted")();
      })));
}

// Admin: nodes and slots -----------------------------------------------------------------------

async function nodesPage(main) {
  const list = h("div", {id: "nodes"});
  main.replaceChildren(h("h1", {}, "Nodes"),
    h("p", {class: "lead"}, "Every node that started on this database, newest first."), list);
  const page = {title: "Nodes"};
  page.refresh = async () => {
    const answer = await api("GET", "/api/v1/admin/nodes");
    rerender(list, () => h("table", {class: "list"}, h("thead", {}, h("tr", {},
      ["Node", "Host", "Pid", "Version", "Started", "Stopped"].map((t) => h("th", {scope: "col"}, t)))),
    h("tbody", {}, answer.nodes.map((n) => h("tr", {},
      h("td", {"data-label": "Node"}, h("code", {}, n.worker_id)), h("td", {"data-label": "Host"}, n.host),
      h("td", {"data-label": "Pid"}, String(n.pid)), h("td", {"data-label": "Version"}, n.version),
      h("td", {"data-label": "Started"}, time(n.started_at)),
      h("td", {"data-label": "Stopped"}, n.stopped_at ? time(n.stopped_at) : "running"))))));
  };
  await page.refresh();
  return page;
}

async function slotsPage(main) {
  const list = h("div", {id: "slots"});
  const held = h("p", {class: "lead"});
  main.replaceChildren(h("h1", {}, "Slots"), held, list);
  const page = {title: "Slots"};
  page.refresh = async () => {
    const answer = await api("GET", "/api/v1/admin/slots");
    held.textContent = `${answer.held} child slots held across the cluster, oldest first.`;
    rerender(list, () => answer.slots.length === 0 ? h("p", {class: "empty"}, "No slot is held.")
      : h("table", {class: "list"}, h("thead", {}, h("tr", {},
        ["Workflow", "Step", "Attempt", "Held since"].map((t) => h("th", {scope: "col"}, t)))),
      h("tbody", {}, answer.slots.map((s) => h("tr", {},
        h("td", {"data-label": "Workflow"}, h("a", {href: `#/workflows/${s.run_id}`}, s.run_id)),
        h("td", {"data-label": "Step"}, s.step_id), h("td", {"data-label": "Attempt"}, String(s.attempt)),
        h("td", {"data-label": "Held since"}, time(s.created_at)))))));
  };
  await page.refresh();
  return page;
}

// ---------------------------------------------------------------------------------------------
// Start.

async function start() {
  document.getElementById("sign-out").addEventListener("click", signOut);
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      clearTimeout(state.pollTimer);
      closeStream();
    } else {
      openStream();
      poll();
    }
  });
  try {
    state.user = await api("GET", "/api/v1/auth/me", undefined, {quiet401: true});
  } catch (error) {
    state.user = null;
    if (error.status !== 401) say(errorText(error), "error");
  }
  showUser();
  window.addEventListener("hashchange", route);
  await route();
}

start();
