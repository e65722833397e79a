// Exchanges: the list (paged by the server), declare, and an exchange's
// page: its bindings (add, remove), a super stream's partitions, publish a
// message, delete.

import { api, get, seg, vhostNames } from "../api.js";
import { h, fill, rate, table, pairs, form, link, parseArgs, args } from "../dom.js";
import { pagedList } from "../list.js";
import { act, flash } from "../app.js";

const exLink = (vhost, name) => link(`#/exchanges/${seg(vhost)}/${seg(name || "amq.default")}`, name || "(AMQP default)");

function bindingsTable(vhost, list, side) {
  return table([
    { label: side === "source" ? "To" : "From", value: (b) => (side === "source"
      ? (b.destination_type === "queue" ? link(`#/queues/${seg(vhost)}/${seg(b.destination)}`, b.destination) : exLink(vhost, b.destination))
      : exLink(vhost, b.source)) },
    { label: "Kind", value: (b) => b.destination_type },
    { label: "Routing key", value: (b) => b.routing_key },
    { label: "Arguments", value: (b) => args(b.arguments) },
    { label: "", value: (b) => (b.source === "" ? "" : h("button", {
      onclick: () => act(() => api("DELETE", `/bindings/${seg(vhost)}/e/${seg(b.source)}/${b.destination_type === "queue" ? "q" : "e"}/${seg(b.destination)}/${seg(b.properties_key)}`), "Unbound"),
    }, "Unbind")) },
  ], list, { empty: "No bindings." });
}

// The form that publishes a message through exchange `name` of `vhost`.
export function publishForm(vhost, name, routingKey = "") {
  return form("Publish message", [
    { name: "routing_key", label: "Routing key", value: routingKey },
    { name: "delivery_mode", label: "Delivery mode", options: [["2", "2 - persistent"], ["1", "1 - non-persistent"]] },
    { name: "headers", label: "Headers (k=v lines)", type: "textarea" },
    { name: "properties", label: "Properties (k=v lines)", type: "textarea", placeholder: "content_type=text/plain" },
    { name: "payload", label: "Payload", type: "textarea" },
  ], "Publish", async (v) => {
    const properties = parseArgs(v.properties);
    properties.delivery_mode = Number(v.delivery_mode);
    const headers = parseArgs(v.headers);
    if (Object.keys(headers).length) properties.headers = headers;
    let routed = false;
    const ok = await act(async () => {
      const r = await api("POST", `/exchanges/${seg(vhost)}/${seg(name || "amq.default")}/publish`, {
        properties, routing_key: v.routing_key, payload: v.payload, payload_encoding: "string",
      });
      routed = r.routed;
    });
    if (ok) flash(routed ? "Message published" : "Message published, but not routed", routed);
    return ok;
  }, { id: "publish", keep: true });
}

// A super stream is a direct exchange with `x-super-stream`; its
// partitions are the streams bound to it, in `x-stream-partition-order`.
const isSuperStream = (x) => Boolean(x.arguments && x.arguments["x-super-stream"]);

function partitionsTable(vhost, bindings) {
  const order = (b) => Number((b.arguments || {})["x-stream-partition-order"] ?? Infinity);
  const partitions = bindings.filter((b) => b.destination_type === "queue").sort((a, b) => order(a) - order(b));
  return table([
    { label: "Order", value: (b) => String(order(b)), num: true },
    { label: "Partition", value: (b) => link(`#/queues/${seg(vhost)}/${seg(b.destination)}`, b.destination) },
    { label: "Binding key", value: (b) => b.routing_key },
  ], partitions, { empty: "No partitions." });
}

async function exchange(view, vhost, name) {
  name = name === "amq.default" ? "" : name;
  const live = h("div");
  const bind = form("Add binding from this exchange", [
    { name: "kind", label: "To", options: [["q", "Queue"], ["e", "Exchange"]] },
    { name: "destination", label: "Name" },
    { name: "routing_key", label: "Routing key" },
    { name: "arguments", label: "Arguments (k=v lines)", type: "textarea" },
  ], "Bind", (v) => act(() => api("POST", `/bindings/${seg(vhost)}/e/${seg(name)}/${v.kind}/${seg(v.destination)}`,
    { routing_key: v.routing_key, arguments: parseArgs(v.arguments) }), "Bound"), { id: "bind" });
  const del = h("button", {
    class: "danger",
    onclick: () => act(async () => {
      await api("DELETE", `/exchanges/${seg(vhost)}/${seg(name)}`);
      location.hash = "#/exchanges";
    }, "Exchange deleted"),
  }, "Delete this exchange");
  view.append(h("h1", {}, `Exchange ${name || "(AMQP default)"} in ${vhost}`), live,
    name ? bind : "", publishForm(vhost, name), name ? h("div", { class: "toolbar" }, del) : "");
  const refresh = async () => {
    const x = await get(`/exchanges/${seg(vhost)}/${seg(name || "amq.default")}`);
    const [out, into] = name ? await Promise.all([
      get(`/exchanges/${seg(vhost)}/${seg(name)}/bindings/source`),
      get(`/exchanges/${seg(vhost)}/${seg(name)}/bindings/destination`),
    ]) : [[], []];
    const s = x.message_stats || {};
    const partitions = isSuperStream(x) ? [h("h2", { id: "partitions" }, "Super stream partitions"), partitionsTable(vhost, out)] : [];
    fill(live, pairs([
      ["Type", isSuperStream(x) ? `${x.type} (super stream)` : x.type],
      ["Durable", x.durable ? "yes" : "no"], ["Auto-delete", x.auto_delete ? "yes" : "no"],
      ["Internal", x.internal ? "yes" : "no"], ["Arguments", args(x.arguments)], ["Policy", x.policy || ""],
      ["Publish in", rate(s.publish_in_details && s.publish_in_details.rate)],
      ["Publish out", rate(s.publish_out_details && s.publish_out_details.rate)],
    ]), ...partitions, name ? [h("h2", {}, "Bindings from here"), bindingsTable(vhost, out, "source"),
      h("h2", {}, "Bindings to here"), bindingsTable(vhost, into, "destination")] : "");
  };
  await refresh();
  return refresh;
}

export async function page(view, params) {
  if (params.length >= 2) return exchange(view, params[0], params.slice(1).join("/"));
  const [overview, vhosts] = await Promise.all([get("/overview"), vhostNames()]);
  const types = (overview.exchange_types || []).filter((t) => !t.internal_purpose).map((t) => t.name);
  const list = pagedList("/exchanges", [
    { label: "Vhost", value: (x) => x.vhost, sort: "vhost" },
    { label: "Name", value: (x) => exLink(x.vhost, x.name), sort: "name" },
    { label: "Type", value: (x) => x.type, sort: "type" },
    { label: "Features", value: (x) => [x.durable ? "D" : "", x.auto_delete ? "AD" : "", x.internal ? "I" : "",
      isSuperStream(x) ? "super stream" : ""].filter(Boolean).join(" ") },
    { label: "Policy", value: (x) => x.policy || "" },
    { label: "In", value: (x) => rate(x.message_stats && x.message_stats.publish_in_details && x.message_stats.publish_in_details.rate), num: true },
    { label: "Out", value: (x) => rate(x.message_stats && x.message_stats.publish_out_details && x.message_stats.publish_out_details.rate), num: true },
  ]);
  const add = form("Add a new exchange", [
    { name: "vhost", label: "Virtual host", options: vhosts },
    { name: "name", label: "Name" },
    { name: "type", label: "Type", options: types.length ? types : ["direct", "fanout", "topic", "headers"] },
    { name: "durable", label: "Durable", options: [["true", "Durable"], ["false", "Transient"]] },
    { name: "auto_delete", label: "Auto delete", options: [["false", "No"], ["true", "Yes"]] },
    { name: "internal", label: "Internal", options: [["false", "No"], ["true", "Yes"]] },
    { name: "arguments", label: "Arguments (k=v lines)", type: "textarea" },
  ], "Add exchange", (v) => act(() => api("PUT", `/exchanges/${seg(v.vhost)}/${seg(v.name)}`, {
    type: v.type, durable: v.durable === "true", auto_delete: v.auto_delete === "true",
    internal: v.internal === "true", arguments: parseArgs(v.arguments),
  }), `Exchange ${v.name} declared`), { id: "add-exchange" });
  view.append(h("h1", {}, "Exchanges"), list.el, add);
  await list.refresh();
  return list.refresh;
}
