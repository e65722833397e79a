// Queues: the list (paged, sorted and filtered by the server, so 100,000
// queues cost one page), declare, and a queue's page: depth and rate
// charts, consumers, bindings, publish, get, move to another queue,
// purge, delete.

import { api, get, seg, vhostNames } from "../api.js";
import { h, fill, num, rate, bytes, table, pairs, form, link, parseArgs, args } from "../dom.js";
import { pagedList } from "../list.js";
import { act, flash } from "../app.js";
import { messageCharts, HISTORY } from "./overview.js";
import { publishForm } from "./exchanges.js";

const qLink = (q) => link(`#/queues/${seg(q.vhost)}/${seg(q.name)}`, q.name);
const r = (s, k) => s && s[k] && s[k].rate;

function features(q) {
  const f = [q.durable ? "D" : "", q.auto_delete ? "AD" : "", q.exclusive ? "Excl" : ""];
  for (const k of Object.keys(q.arguments || {})) f.push(k.replace(/^x-/, ""));
  return f.filter(Boolean).join(" ");
}

function getForm(vhost, name, out) {
  return form("Get messages", [
    { name: "ackmode", label: "Ack mode", options: [
      ["ack_requeue_true", "Nack message requeue true"],
      ["ack_requeue_false", "Automatic ack"],
      ["reject_requeue_true", "Reject requeue true"],
      ["reject_requeue_false", "Reject requeue false"],
    ] },
    { name: "encoding", label: "Encoding", options: [["auto", "Auto string / base64"], ["base64", "base64"]] },
    { name: "count", label: "Messages", type: "number", value: "1" },
  ], "Get message(s)", async (v) => {
    try {
      const msgs = await api("POST", `/queues/${seg(vhost)}/${seg(name)}/get`, {
        count: Number(v.count) || 1, ackmode: v.ackmode, encoding: v.encoding, truncate: 50000,
      });
      fill(out, msgs.length === 0 ? h("p", { class: "empty" }, "Queue is empty") : msgs.map((m, i) =>
        h("div", { class: "message" }, h("h3", {}, `Message ${i + 1}`), pairs([
          ["Exchange", m.exchange || "(AMQP default)"], ["Routing key", m.routing_key],
          ["Redelivered", m.redelivered ? "yes" : "no"], ["Remaining", num(m.message_count)],
          ["Properties", args(m.properties)], ["Payload", `${bytes(m.payload_bytes)}, ${m.payload_encoding}`],
        ]), h("pre", { class: "payload" }, m.payload))));
      refreshSoon();
      return true;
    } catch (e) {
      flash(e.message, false);
      return false;
    }
  }, { id: "get", keep: true });
}

/// A stream's get: a look from an offset, which moves and removes nothing.
function streamReadForm(vhost, name, out) {
  return form("Read messages", [
    { name: "offset", label: "From offset", value: "first", placeholder: "first, last, next, a number, or 1h" },
    { name: "encoding", label: "Encoding", options: [["auto", "Auto string / base64"], ["base64", "base64"]] },
    { name: "count", label: "Messages", type: "number", value: "10" },
  ], "Read message(s)", async (v) => {
    const offset = /^\d+$/.test(v.offset.trim()) ? Number(v.offset.trim()) : v.offset.trim() || "first";
    try {
      const msgs = await api("POST", `/queues/${seg(vhost)}/${seg(name)}/get`, {
        count: Number(v.count) || 1, ackmode: "ack_requeue_true", encoding: v.encoding, truncate: 50000, offset,
      });
      fill(out, msgs.length === 0 ? h("p", { class: "empty" }, "Nothing from that offset") : msgs.map((m) =>
        h("div", { class: "message" }, h("h3", {}, `Offset ${(m.properties.headers || {})["x-stream-offset"]}`), pairs([
          ["Exchange", m.exchange || "(AMQP default)"], ["Routing key", m.routing_key],
          ["Properties", args(m.properties)], ["Payload", `${bytes(m.payload_bytes)}, ${m.payload_encoding}`],
        ]), h("pre", { class: "payload" }, m.payload))));
      return true;
    } catch (e) {
      flash(e.message, false);
      return false;
    }
  }, { id: "read", keep: true });
}

let refreshSoon = () => {};

function moveForm(vhost, name) {
  return form("Move messages", [
    { name: "destination", label: "To queue", placeholder: "queue in the same vhost" },
    { name: "count", label: "At most", type: "number", placeholder: "all" },
  ], "Move messages", async (v) => {
    const body = { action: "move", destination: v.destination };
    if (v.count) body.count = Number(v.count);
    let moved = 0;
    const ok = await act(async () => {
      const res = await api("POST", `/queues/${seg(vhost)}/${seg(name)}/actions`, body);
      moved = res && res.moved;
    });
    if (ok) flash(`Moved ${num(moved)} message${moved === 1 ? "" : "s"} to ${v.destination}`);
    return ok;
  }, { id: "move" });
}

async function queue(view, vhost, name) {
  const live = h("div");
  const got = h("div");
  const bind = form("Add binding to this queue", [
    { name: "source", label: "From exchange" },
    { name: "routing_key", label: "Routing key" },
    { name: "arguments", label: "Arguments (k=v lines)", type: "textarea" },
  ], "Bind", (v) => act(() => api("POST", `/bindings/${seg(vhost)}/e/${seg(v.source)}/q/${seg(name)}`,
    { routing_key: v.routing_key, arguments: parseArgs(v.arguments) }), "Bound"), { id: "bind" });
  const purge = h("button", {
    class: "danger",
    onclick: () => confirm(`Purge every message of ${name}?`) &&
      act(() => api("DELETE", `/queues/${seg(vhost)}/${seg(name)}/contents`), "Queue purged"),
  }, "Purge messages");
  const del = h("button", {
    class: "danger",
    onclick: () => confirm(`Delete queue ${name}?`) && act(async () => {
      await api("DELETE", `/queues/${seg(vhost)}/${seg(name)}`);
      location.hash = "#/queues";
    }, "Queue deleted"),
  }, "Delete queue");
  const kind = (await get(`/queues/${seg(vhost)}/${seg(name)}`)).type;
  const reading = kind === "stream"
    ? [streamReadForm(vhost, name, got), got, publishForm(vhost, "", name)]
    : [getForm(vhost, name, got), got, publishForm(vhost, "", name), moveForm(vhost, name)];
  view.append(h("h1", {}, `Queue ${name} in ${vhost}`), live,
    h("h2", {}, "Messages"), ...reading,
    bind, h("div", { class: "toolbar" }, ...(kind === "stream" ? [del] : [purge, del])));
  const refresh = async () => {
    const [q, bindings] = await Promise.all([
      get(`/queues/${seg(vhost)}/${seg(name)}?${HISTORY}`),
      get(`/queues/${seg(vhost)}/${seg(name)}/bindings`),
    ]);
    const s = q.message_stats || {};
    fill(live,
      h("div", { class: "cards" },
        ...[["Total", q.messages], ["Ready", q.messages_ready], ["Unacked", q.messages_unacknowledged], ["Consumers", q.consumers]]
          .map(([l, n]) => h("div", { class: "card" }, h("div", { class: "n", "data-depth": l }, num(n)), h("div", { class: "l" }, l)))),
      messageCharts(q, s),
      h("h2", {}, "Details"),
      pairs([
        ["Type", q.type], ["Features", features(q)], ["State", q.state], ["Policy", q.policy || ""],
        ["Arguments", args(q.arguments)], ["Memory", bytes(q.memory)], ["Message bytes", bytes(q.message_bytes)],
        ...(q.type === "stream" ? [["First offset", q.first_offset ?? "-"], ["Last offset", q.last_offset ?? "-"],
          ["Segments", num(q.segments)]] : []),
      ]),
      h("h2", {}, "Consumers"),
      table([
        { label: "Channel", value: (c) => c.channel_details && link(`#/channels/${seg(c.channel_details.name)}`, c.channel_details.name) },
        { label: "Tag", value: (c) => c.consumer_tag },
        { label: "Ack required", value: (c) => (c.ack_required ? "yes" : "no") },
        { label: "Prefetch", value: (c) => c.prefetch_count, num: true },
        { label: "Active", value: (c) => (c.active === false ? "no" : "yes") },
      ], q.consumer_details, { empty: "No consumers." }),
      h("h2", {}, "Bindings"),
      table([
        { label: "From", value: (b) => b.source || "(AMQP default)" },
        { label: "Routing key", value: (b) => b.routing_key },
        { label: "Arguments", value: (b) => args(b.arguments) },
        { label: "", value: (b) => (b.source === "" ? "" : h("button", {
          onclick: () => act(() => api("DELETE", `/bindings/${seg(vhost)}/e/${seg(b.source)}/q/${seg(name)}/${seg(b.properties_key)}`), "Unbound"),
        }, "Unbind")) },
      ], bindings));
  };
  refreshSoon = () => refresh().catch(() => {});
  await refresh();
  return refresh;
}

export async function page(view, params) {
  if (params.length >= 2) return queue(view, params[0], params.slice(1).join("/"));
  const vhosts = await vhostNames();
  const list = pagedList("/queues", [
    { label: "Vhost", value: (q) => q.vhost, sort: "vhost" },
    { label: "Name", value: qLink, sort: "name" },
    { label: "Type", value: (q) => q.type, sort: "type" },
    { label: "Features", value: features },
    { label: "State", value: (q) => q.state },
    { label: "Ready", value: (q) => num(q.messages_ready), num: true, sort: "messages_ready" },
    { label: "Unacked", value: (q) => num(q.messages_unacknowledged), num: true, sort: "messages_unacknowledged" },
    { label: "Total", value: (q) => num(q.messages), num: true, sort: "messages" },
    { label: "Incoming", value: (q) => rate(r(q.message_stats, "publish_details")), num: true },
    { label: "Deliver / get", value: (q) => rate(r(q.message_stats, "deliver_get_details")), num: true },
    { label: "Ack", value: (q) => rate(r(q.message_stats, "ack_details")), num: true },
  ], { empty: "No queues." });
  const add = form("Add a new queue", [
    { name: "vhost", label: "Virtual host", options: vhosts },
    { name: "type", label: "Type", options: ["classic", "quorum", "stream"] },
    { name: "name", label: "Name" },
    { name: "durable", label: "Durability", options: [["true", "Durable"], ["false", "Transient"]] },
    { name: "auto_delete", label: "Auto delete", options: [["false", "No"], ["true", "Yes"]] },
    { name: "arguments", label: "Arguments (k=v lines)", type: "textarea", placeholder: "x-message-ttl=60000" },
  ], "Add queue", (v) => act(() => api("PUT", `/queues/${seg(v.vhost)}/${seg(v.name)}`, {
    durable: v.durable === "true", auto_delete: v.auto_delete === "true",
    arguments: { ...parseArgs(v.arguments), "x-queue-type": v.type },
  }), `Queue ${v.name} declared`), { id: "add-queue" });
  view.append(h("h1", {}, "Queues"), list.el, add);
  await list.refresh();
  return list.refresh;
}
