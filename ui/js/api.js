// The management API, as every page reaches it: the public /api with HTTP
// basic auth, the credentials kept for this tab only (sessionStorage).

const KEY = "warren.auth";

export function credentials() {
  return sessionStorage.getItem(KEY);
}

export function logout() {
  sessionStorage.removeItem(KEY);
}

// An error the API answered, with RabbitMQ's {"error", "reason"}.
export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.reason ? `${status}: ${body.reason}` : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function send(method, path, body, auth) {
  const headers = {
    // Asks the API not to challenge: the browser's own login box would
    // cover the page's.
    "X-Requested-With": "XMLHttpRequest",
    Authorization: "Basic " + auth,
  };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch("/api" + path, init);
  const text = await r.text();
  let json = null;
  if (text) {
    try { json = JSON.parse(text); } catch { json = { reason: text }; }
  }
  if (!r.ok) throw new ApiError(r.status, json);
  return json;
}

// Checks `user` and `password`; keeps them when the API takes them.
export async function login(user, password) {
  const auth = btoa(unescape(encodeURIComponent(`${user}:${password}`)));
  const me = await send("GET", "/whoami", undefined, auth);
  sessionStorage.setItem(KEY, auth);
  return me;
}

// Calls the API as the logged-in user.
export function api(method, path, body) {
  const auth = credentials();
  if (!auth) return Promise.reject(new ApiError(401, { reason: "Not logged in" }));
  return send(method, path, body, auth);
}

export const get = (path) => api("GET", path);

// One path segment, encoded as the API wants it ("/" is %2F).
export const seg = (s) => encodeURIComponent(s);

// The names of the vhosts the user may see.
export async function vhostNames() {
  const vs = await get("/vhosts");
  return vs.map((v) => v.name);
}
