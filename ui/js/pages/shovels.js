// Admin › Shovels: the status of every shovel (GET /api/shovels), its
// restart, pause, resume and deletion, and a form that makes a dynamic
// shovel (PUT /api/parameters/shovel/{vhost}/{name}), as RabbitMQ's
// shovel management pages do.

import { api, get, seg, vhostNames } from "../api.js";
import { h, fill, num, table, form } from "../dom.js";
import { act } from "../app.js";

const path = (s) => `/shovels/vhost/${seg(s.vhost)}/${seg(s.name)}`;

// Where it takes from, or sends to: "queue q", "exchange x (key k)".
function end(s, side) {
  const q = s[`${side}_queue`];
  if (q !== undefined) return `queue ${q}`;
  const x = s[`${side}_exchange`];
  const k = s[`${side}_exchange_key`];
  if (x !== undefined) return `exchange ${x}${k ? ` (key ${k})` : ""}`;
  return k ? `own exchange (key ${k})` : "";
}

function actions(s) {
  if (s.type !== "dynamic") return "";
  const button = (label, method, suffix, done, cls) => h("button", {
    class: cls || null,
    onclick: () => act(() => api(method, path(s) + suffix), done),
  }, label);
  return [
    s.state === "paused"
      ? button("Resume", "PUT", "/resume", `Shovel ${s.name} resumed`)
      : button("Pause", "PUT", "/pause", `Shovel ${s.name} paused`),
    button("Restart", "DELETE", "/restart", `Shovel ${s.name} restarted`),
    h("button", {
      class: "danger",
      onclick: () => confirm(`Delete shovel ${s.name}?`) &&
        act(() => api("DELETE", path(s)), `Shovel ${s.name} deleted`),
    }, "Delete"),
  ];
}

// The form's values as a shovel's definition: only what was filled in.
function definition(v) {
  const d = { "src-uri": v.src_uri, "dest-uri": v.dest_uri, "ack-mode": v.ack_mode };
  d[v.src_type === "exchange" ? "src-exchange" : "src-queue"] = v.src;
  if (v.src_type === "exchange" && v.src_key) d["src-exchange-key"] = v.src_key;
  d[v.dest_type === "exchange" ? "dest-exchange" : "dest-queue"] = v.dest;
  if (v.dest_type === "exchange" && v.dest_key) d["dest-exchange-key"] = v.dest_key;
  if (v.prefetch) d["src-prefetch-count"] = Number(v.prefetch);
  if (v.reconnect) d["reconnect-delay"] = Number(v.reconnect);
  if (v.delete_after) d["src-delete-after"] = /^\d+$/.test(v.delete_after) ? Number(v.delete_after) : v.delete_after;
  if (v.forward) d["dest-add-forward-headers"] = true;
  return d;
}

export async function page(view) {
  const live = h("div");
  view.append(live, form("Add a shovel", [
    { name: "vhost", label: "Virtual host", options: await vhostNames() },
    { name: "name", label: "Name" },
    { name: "src_uri", label: "Source URI (no host: this broker)", value: "amqp://user:password@/%2F" },
    { name: "src_type", label: "Source", options: ["queue", "exchange"] },
    { name: "src", label: "Source queue or exchange" },
    { name: "src_key", label: "Source routing key (an exchange's binding)" },
    { name: "dest_uri", label: "Destination URI", value: "amqp://user:password@/%2F" },
    { name: "dest_type", label: "Destination", options: ["queue", "exchange"] },
    { name: "dest", label: "Destination queue or exchange" },
    { name: "dest_key", label: "Destination routing key (blank: the message's own)" },
    { name: "ack_mode", label: "Acknowledgement mode", options: ["on-confirm", "on-publish", "no-ack"] },
    { name: "prefetch", label: "Prefetch count", type: "number", placeholder: "1000" },
    { name: "reconnect", label: "Reconnect delay (s)", type: "number", placeholder: "5" },
    { name: "delete_after", label: "Delete after (never, queue-length or a count)", placeholder: "never" },
    { name: "forward", label: "Add forwarding headers", type: "checkbox" },
  ], "Add shovel", (v) => act(() => api("PUT", `/parameters/shovel/${seg(v.vhost)}/${seg(v.name)}`,
    { value: definition(v) }), `Shovel ${v.name} added`), { id: "add-shovel" }));
  const refresh = async () => {
    fill(live, table([
      { label: "Name", value: (s) => s.name },
      { label: "Virtual host", value: (s) => s.vhost || "" },
      { label: "Type", value: (s) => s.type },
      { label: "State", value: (s) => h("span", { class: s.state === "terminated" ? "tag bad" : "tag" }, s.state) },
      { label: "Source", value: (s) => [s.src_uri || "", " ", end(s, "src")] },
      { label: "Destination", value: (s) => [s.dest_uri || "", " ", end(s, "dest")] },
      { label: "Forwarded", value: (s) => num(s.forwarded), num: true },
      { label: "Since", value: (s) => s.timestamp },
      { label: "Reason", value: (s) => s.reason || "" },
      { label: "", value: actions },
    ], await get("/shovels"), { empty: "No shovels." }));
  };
  await refresh();
  return refresh;
}
