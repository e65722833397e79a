// Admin › Federation: the status of every federation link (GET
// /api/federation-links) and its restart, the upstreams (the
// federation-upstream parameters) and their deletion, and a form that
// makes an upstream, as RabbitMQ's federation management pages do.
// Which exchanges and queues are federated is a policy's business
// (federation-upstream, federation-upstream-set).

import { api, get, seg, vhostNames } from "../api.js";
import { h, fill, table, form } from "../dom.js";
import { act } from "../app.js";

// A URI as the table shows it: without its user and password.
const redact = (u) => String(u).replace(/\/\/[^@/]*@/, "//");

function restart(l) {
  const path = `/federation-links/vhost/${seg(l.vhost)}/${seg(l.id)}/${seg(l.node)}/restart`;
  return h("button", { onclick: () => act(() => api("DELETE", path), `Link ${l.id} restarted`) }, "Restart");
}

function remove(u) {
  return h("button", {
    class: "danger",
    onclick: () => confirm(`Delete upstream ${u.name}?`) &&
      act(() => api("DELETE", `/parameters/federation-upstream/${seg(u.vhost)}/${seg(u.name)}`),
        `Upstream ${u.name} deleted`),
  }, "Delete");
}

// The form's values as an upstream's definition: only what was filled in.
function definition(v) {
  const uris = v.uri.split(/\s+/).filter(Boolean);
  const d = { uri: uris.length === 1 ? uris[0] : uris, "ack-mode": v.ack_mode };
  for (const [key, field] of [["prefetch-count", "prefetch"], ["reconnect-delay", "reconnect"],
    ["max-hops", "max_hops"], ["expires", "expires"], ["message-ttl", "ttl"]]) {
    if (v[field] !== "") d[key] = Number(v[field]);
  }
  for (const [key, field] of [["exchange", "exchange"], ["queue", "queue"], ["consumer-tag", "tag"]]) {
    if (v[field]) d[key] = v[field];
  }
  if (v.trust) d["trust-user-id"] = true;
  return d;
}

export async function page(view) {
  const links = h("div");
  const upstreams = h("div");
  view.append(h("h2", {}, "Federation status"), links, h("h2", {}, "Upstreams"), upstreams,
    form("Add an upstream", [
      { name: "vhost", label: "Virtual host", options: await vhostNames() },
      { name: "name", label: "Name" },
      { name: "uri", label: "URI (several: separated by spaces)", value: "amqp://user:password@host" },
      { name: "prefetch", label: "Prefetch count", type: "number", placeholder: "1000" },
      { name: "reconnect", label: "Reconnect delay (s)", type: "number", placeholder: "5" },
      { name: "ack_mode", label: "Acknowledgement mode", options: ["on-confirm", "on-publish", "no-ack"] },
      { name: "trust", label: "Trust user-id", type: "checkbox" },
      { name: "exchange", label: "Exchange (federated exchanges; blank: the same name)" },
      { name: "max_hops", label: "Max hops", type: "number", placeholder: "1" },
      { name: "expires", label: "Expires (ms)", type: "number" },
      { name: "ttl", label: "Message TTL (ms)", type: "number" },
      { name: "queue", label: "Queue (federated queues; blank: the same name)" },
      { name: "tag", label: "Consumer tag" },
    ], "Add upstream", (v) => act(() => api("PUT",
      `/parameters/federation-upstream/${seg(v.vhost)}/${seg(v.name)}`, { value: definition(v) }),
    `Upstream ${v.name} added`), { id: "add-upstream" }));
  const refresh = async () => {
    const [l, u] = await Promise.all([get("/federation-links"), get("/parameters/federation-upstream")]);
    fill(links, table([
      { label: "Upstream", value: (x) => x.upstream },
      { label: "URI", value: (x) => x.uri },
      { label: "Virtual host", value: (x) => x.vhost },
      { label: "Exchange / queue", value: (x) => x.type === "queue" ? `queue ${x.queue}` : `exchange ${x.exchange}` },
      { label: "State", value: (x) => h("span", { class: x.status === "running" ? "tag" : "tag bad" }, x.status) },
      { label: "Since", value: (x) => x.timestamp },
      { label: "Error", value: (x) => x.error || "" },
      { label: "ID", value: (x) => x.id },
      { label: "", value: restart },
    ], l, { empty: "No federation links." }));
    fill(upstreams, table([
      { label: "Virtual host", value: (x) => x.vhost },
      { label: "Name", value: (x) => x.name },
      { label: "URI", value: (x) => [].concat(x.value.uri).map(redact).join(" ") },
      { label: "Ack mode", value: (x) => x.value["ack-mode"] || "on-confirm" },
      { label: "Max hops", value: (x) => x.value["max-hops"] ?? 1 },
      { label: "", value: remove },
    ], u, { empty: "No upstreams." }));
  };
  await refresh();
  return refresh;
}
