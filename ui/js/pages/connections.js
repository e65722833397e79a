// Connections (list, detail with its channels, force close) and channels
// (list, detail with consumers).

import { api, get, seg } from "../api.js";
import { h, fill, num, rate, bytes, table, pairs, link } from "../dom.js";
import { pagedList } from "../list.js";
import { act } from "../app.js";

const connLink = (name) => link(`#/connections/${seg(name)}`, name);
const chanLink = (name) => link(`#/channels/${seg(name)}`, name);

const channelColumns = [
  { label: "Channel", value: (c) => chanLink(c.name), sort: "name" },
  { label: "User", value: (c) => c.user },
  { label: "Vhost", value: (c) => c.vhost },
  { label: "Mode", value: (c) => [c.confirm ? "confirm" : "", c.transactional ? "tx" : ""].filter(Boolean).join(", ") },
  { label: "Prefetch", value: (c) => c.prefetch_count, num: true },
  { label: "Consumers", value: (c) => num(c.consumer_count), num: true, sort: "consumer_count" },
  { label: "Unacked", value: (c) => num(c.messages_unacknowledged), num: true, sort: "messages_unacknowledged" },
  { label: "Publish", value: (c) => rate(c.message_stats && c.message_stats.publish_details && c.message_stats.publish_details.rate), num: true },
];

async function connection(view, name) {
  const live = h("div");
  const close = h("button", {
    class: "danger",
    onclick: () => act(async () => {
      await api("DELETE", `/connections/${seg(name)}`);
      location.hash = "#/connections";
    }, "Connection closed"),
  }, "Force close");
  view.append(h("h1", {}, `Connection ${name}`), live, h("div", { class: "toolbar" }, close));
  const refresh = async () => {
    const [c, chans] = await Promise.all([get(`/connections/${seg(name)}`), get(`/connections/${seg(name)}/channels`)]);
    const product = c.client_properties && (c.client_properties.product || c.client_properties.platform);
    fill(live, pairs([
      ["User", c.user], ["Vhost", c.vhost], ["State", c.state], ["Protocol", c.protocol],
      ["Client", product], ["From", `${c.peer_host}:${c.peer_port}`], ["TLS", c.ssl ? "yes" : "no"],
      ["Received", `${bytes(c.recv_oct)} (${rate(c.recv_oct_details && c.recv_oct_details.rate)})`],
      ["Sent", `${bytes(c.send_oct)} (${rate(c.send_oct_details && c.send_oct_details.rate)})`],
    ]), h("h2", {}, "Channels"), table(channelColumns, chans));
  };
  await refresh();
  return refresh;
}

export async function connectionsPage(view, params) {
  if (params.length) return connection(view, params.join("/"));
  const list = pagedList("/connections", [
    { label: "Name", value: (c) => connLink(c.name), sort: "name" },
    { label: "User", value: (c) => c.user, sort: "user" },
    { label: "Vhost", value: (c) => c.vhost, sort: "vhost" },
    { label: "Client", value: (c) => c.client_properties && c.client_properties.product },
    { label: "TLS", value: (c) => (c.ssl ? "yes" : "") },
    { label: "State", value: (c) => c.state },
    { label: "Channels", value: (c) => c.channels, num: true, sort: "channels" },
    { label: "From client", value: (c) => rate(c.recv_oct_details && c.recv_oct_details.rate), num: true },
    { label: "To client", value: (c) => rate(c.send_oct_details && c.send_oct_details.rate), num: true },
  ]);
  view.append(h("h1", {}, "Connections"), list.el);
  await list.refresh();
  return list.refresh;
}

async function channel(view, name) {
  const live = h("div");
  view.append(h("h1", {}, `Channel ${name}`), live);
  const refresh = async () => {
    const c = await get(`/channels/${seg(name)}`);
    const conn = c.connection_details && c.connection_details.name;
    fill(live, pairs([
      ["Connection", conn ? connLink(conn) : undefined], ["User", c.user], ["Vhost", c.vhost],
      ["Prefetch", c.prefetch_count], ["Confirm mode", c.confirm ? "yes" : "no"],
      ["Unacked", num(c.messages_unacknowledged)], ["Unconfirmed", num(c.messages_unconfirmed)],
    ]), h("h2", {}, "Consumers"), table([
      { label: "Tag", value: (k) => k.consumer_tag },
      { label: "Queue", value: (k) => k.queue && link(`#/queues/${seg(k.queue.vhost)}/${seg(k.queue.name)}`, k.queue.name) },
      { label: "Ack required", value: (k) => (k.ack_required ? "yes" : "no") },
      { label: "Prefetch", value: (k) => k.prefetch_count, num: true },
    ], c.consumer_details));
  };
  await refresh();
  return refresh;
}

export async function channelsPage(view, params) {
  if (params.length) return channel(view, params.join("/"));
  const list = pagedList("/channels", channelColumns);
  view.append(h("h1", {}, "Channels"), list.el);
  await list.refresh();
  return list.refresh;
}
