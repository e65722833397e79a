// Admin: users (tags, password, permissions, topic permissions), vhosts,
// policies and operator policies, vhost and user limits, shovels
// (shovels.js), federation (federation.js).

import { api, get, seg, vhostNames } from "../api.js";
import { h, fill, num, table, form, link, parseArgs, args } from "../dom.js";
import { pagedList } from "../list.js";
import { act } from "../app.js";
import * as shovels from "./shovels.js";
import * as federation from "./federation.js";

const TABS = [
  ["users", "Users"], ["vhosts", "Virtual hosts"], ["policies", "Policies"],
  ["operator-policies", "Operator policies"], ["limits", "Limits"], ["shovels", "Shovels"],
  ["federation", "Federation"],
];

const del = (label, path, done) => h("button", { class: "danger", onclick: () => act(() => api("DELETE", path), done) }, label);

const tagList = (u) => (Array.isArray(u.tags) ? u.tags : String(u.tags || "").split(",")).filter(Boolean);

async function user(view, name) {
  const live = h("div");
  const [vhosts, current] = await Promise.all([vhostNames(), get(`/users/${seg(name)}`)]);
  view.append(h("h2", {}, `User ${name}`), live,
    form("Set permission", [
      { name: "vhost", label: "Virtual host", options: vhosts },
      { name: "configure", label: "Configure regexp", value: ".*" },
      { name: "write", label: "Write regexp", value: ".*" },
      { name: "read", label: "Read regexp", value: ".*" },
    ], "Set permission", (v) => act(() => api("PUT", `/permissions/${seg(v.vhost)}/${seg(name)}`,
      { configure: v.configure, write: v.write, read: v.read }), "Permission set"), { id: "set-permission", keep: true }),
    form("Set topic permission", [
      { name: "vhost", label: "Virtual host", options: vhosts },
      { name: "exchange", label: "Exchange", value: "amq.topic" },
      { name: "write", label: "Write regexp", value: ".*" },
      { name: "read", label: "Read regexp", value: ".*" },
    ], "Set topic permission", (v) => act(() => api("PUT", `/topic-permissions/${seg(v.vhost)}/${seg(name)}`,
      { exchange: v.exchange, write: v.write, read: v.read }), "Topic permission set"), { id: "set-topic-permission", keep: true }),
    form("Update this user", [
      { name: "tags", label: "Tags", value: tagList(current).join(", ") },
      { name: "password", label: "Password (empty: keep)", type: "password" },
    ], "Update user", async (v) => {
      const u = await get(`/users/${seg(name)}`);
      const body = { tags: v.tags };
      if (v.password) body.password = v.password;
      else {
        body.password_hash = u.password_hash;
        body.hashing_algorithm = u.hashing_algorithm;
      }
      return act(() => api("PUT", `/users/${seg(name)}`, body), "User updated");
    }, { id: "update-user" }),
    h("div", { class: "toolbar" }, h("button", {
      class: "danger",
      onclick: () => act(async () => { await api("DELETE", `/users/${seg(name)}`); location.hash = "#/admin/users"; }, "User deleted"),
    }, "Delete this user")));
  const refresh = async () => {
    const [u, perms, topics] = await Promise.all([
      get(`/users/${seg(name)}`), get(`/users/${seg(name)}/permissions`), get(`/users/${seg(name)}/topic-permissions`),
    ]);
    const tags = tagList(u);
    fill(live,
      h("p", {}, "Tags: ", tags.length ? tags.map((t) => h("span", { class: "tag" }, t)) : h("span", { class: "muted" }, "none")),
      h("h3", {}, "Permissions"),
      table([
        { label: "Virtual host", value: (p) => p.vhost },
        { label: "Configure", value: (p) => p.configure }, { label: "Write", value: (p) => p.write }, { label: "Read", value: (p) => p.read },
        { label: "", value: (p) => del("Clear", `/permissions/${seg(p.vhost)}/${seg(name)}`, "Permission cleared") },
      ], perms, { empty: "No permissions." }),
      h("h3", {}, "Topic permissions"),
      table([
        { label: "Virtual host", value: (p) => p.vhost }, { label: "Exchange", value: (p) => p.exchange },
        { label: "Write", value: (p) => p.write }, { label: "Read", value: (p) => p.read },
        { label: "", value: (p) => del("Clear", `/topic-permissions/${seg(p.vhost)}/${seg(name)}`, "Topic permissions cleared") },
      ], topics, { empty: "No topic permissions." }));
  };
  await refresh();
  return refresh;
}

async function users(view, params) {
  if (params.length) return user(view, params.join("/"));
  const list = pagedList("/users", [
    { label: "Name", value: (u) => link(`#/admin/users/${seg(u.name)}`, u.name), sort: "name" },
    { label: "Tags", value: (u) => tagList(u).map((t) => h("span", { class: "tag" }, t)) },
    { label: "Has password", value: (u) => (u.password_hash ? "yes" : "no") },
  ]);
  view.append(list.el, form("Add a user", [
    { name: "name", label: "Username" },
    { name: "password", label: "Password (blank: no password; the user logs in only with a client certificate, EXTERNAL)", type: "password" },
    { name: "tags", label: "Tags", placeholder: "administrator, monitoring, policymaker, management" },
  ], "Add user", (v) => act(() => api("PUT", `/users/${seg(v.name)}`,
    v.password ? { password: v.password, tags: v.tags } : { password_hash: "", tags: v.tags }),
    v.password ? `User ${v.name} added` : `User ${v.name} added without a password (certificate login only)`),
    { id: "add-user" }));
  await list.refresh();
  return list.refresh;
}

async function vhosts(view) {
  const live = h("div");
  view.append(live, form("Add a virtual host", [
    { name: "name", label: "Name" },
    { name: "description", label: "Description" },
    { name: "default_queue_type", label: "Default queue type", options: ["classic", "quorum"] },
  ], "Add virtual host", (v) => act(() => api("PUT", `/vhosts/${seg(v.name)}`,
    { description: v.description, default_queue_type: v.default_queue_type }), `Virtual host ${v.name} added`), { id: "add-vhost" }));
  const refresh = async () => {
    fill(live, table([
      { label: "Name", value: (v) => v.name },
      { label: "Description", value: (v) => v.description || "" },
      { label: "Messages", value: (v) => num(v.messages), num: true },
      { label: "Ready", value: (v) => num(v.messages_ready), num: true },
      { label: "Unacked", value: (v) => num(v.messages_unacknowledged), num: true },
      { label: "", value: (v) => del("Delete", `/vhosts/${seg(v.name)}`, `Virtual host ${v.name} deleted`) },
    ], await get("/vhosts")));
  };
  await refresh();
  return refresh;
}

async function policies(view, operator) {
  const base = operator ? "/operator-policies" : "/policies";
  const live = h("div");
  view.append(live, form(`Add ${operator ? "an operator policy" : "a policy"}`, [
    { name: "vhost", label: "Virtual host", options: await vhostNames() },
    { name: "name", label: "Name" },
    { name: "pattern", label: "Pattern", placeholder: "^amq\\." },
    { name: "apply_to", label: "Apply to", options: operator ? ["queues"] : ["all", "queues", "exchanges", "classic_queues", "quorum_queues"] },
    { name: "priority", label: "Priority", type: "number", value: "0" },
    { name: "definition", label: "Definition (k=v lines)", type: "textarea", placeholder: "max-length=1000" },
  ], "Add policy", (v) => act(() => api("PUT", `${base}/${seg(v.vhost)}/${seg(v.name)}`, {
    pattern: v.pattern, "apply-to": v.apply_to, priority: Number(v.priority) || 0, definition: parseArgs(v.definition),
  }), `Policy ${v.name} set`), { id: operator ? "add-operator-policy" : "add-policy" }));
  const refresh = async () => {
    fill(live, table([
      { label: "Virtual host", value: (p) => p.vhost }, { label: "Name", value: (p) => p.name },
      { label: "Pattern", value: (p) => p.pattern }, { label: "Apply to", value: (p) => p["apply-to"] },
      { label: "Definition", value: (p) => args(p.definition) }, { label: "Priority", value: (p) => p.priority, num: true },
      { label: "", value: (p) => del("Clear", `${base}/${seg(p.vhost)}/${seg(p.name)}`, `Policy ${p.name} cleared`) },
    ], await get(base), { empty: "No policies." }));
  };
  await refresh();
  return refresh;
}

async function limits(view) {
  const live = h("div");
  view.append(live,
    form("Set a virtual host limit", [
      { name: "vhost", label: "Virtual host", options: await vhostNames() },
      { name: "name", label: "Limit", options: ["max-connections", "max-queues"] },
      { name: "value", label: "Value", type: "number" },
    ], "Set limit", (v) => act(() => api("PUT", `/vhost-limits/${seg(v.vhost)}/${v.name}`, { value: Number(v.value) }), "Limit set"), { id: "vhost-limit" }),
    form("Set a user limit", [
      { name: "user", label: "User" },
      { name: "name", label: "Limit", options: ["max-connections", "max-channels"] },
      { name: "value", label: "Value", type: "number" },
    ], "Set limit", (v) => act(() => api("PUT", `/user-limits/${seg(v.user)}/${v.name}`, { value: Number(v.value) }), "Limit set"), { id: "user-limit" }));
  const refresh = async () => {
    const [vl, ul] = await Promise.all([get("/vhost-limits"), get("/user-limits")]);
    const rows = (list, key, path) => list.flatMap((x) => Object.entries(x.value || {}).map(([k, v]) => ({ who: x[key], k, v, path })));
    fill(live, table([
      { label: "Applies to", value: (x) => x.who }, { label: "Limit", value: (x) => x.k }, { label: "Value", value: (x) => x.v, num: true },
      { label: "", value: (x) => del("Clear", `/${x.path}/${seg(x.who)}/${x.k}`, "Limit cleared") },
    ], [...rows(vl, "vhost", "vhost-limits"), ...rows(ul, "user", "user-limits")], { empty: "No limits." }));
  };
  await refresh();
  return refresh;
}

export async function page(view, params) {
  const tab = params[0] || "users";
  view.append(h("h1", {}, "Admin"), h("div", { class: "toolbar" }, TABS.map(([t, label]) =>
    h("a", { href: `#/admin/${t}`, class: t === tab ? "tag" : null }, label))));
  const body = h("div");
  view.append(body);
  switch (tab) {
    case "vhosts": return vhosts(body);
    case "policies": return policies(body, false);
    case "operator-policies": return policies(body, true);
    case "limits": return limits(body);
    case "shovels": return shovels.page(body);
    case "federation": return federation.page(body);
    default: return users(body, params.slice(1));
  }
}
