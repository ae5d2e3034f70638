/* kefu agent console: team work (issue 32; docs/console.md#assignment). Assignment (the row's
   assignee, "Assign to me", assign or transfer to a colleague with a note), the "Away" switch and
   who is online, "<agent> is viewing / typing" on the open conversation, and keyboard shortcuts
   listed in the "?" overlay. Talks to console.js through its hooks: the "kefu:frame" event (every
   frame), "kefu:alert" (cancelled here: no alert while away, nor for a conversation assigned to
   someone else), "kefu:row" (a list row being drawn) and window.kefuConsole. Texts come
   translated in #team's and #alerts' data-* attributes; set with textContent only (strict CSP). */
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
  const team = $("team");
  if (!team || !window.kefuConsole) return;
  const k = window.kefuConsole;
  const S = k.state;
  const t = (key, vars) => (team.dataset[key] || key).replace(/\{(\w+)\}/g, (_, n) => (vars && vars[n] != null ? vars[n] : ""));
  const my = { away: false, agents: [] };
  // Who else looks at a conversation: "conversation agent-id" -> {cid, name, what, until (ms)};
  // only the open conversation's are shown.
  const others = new Map();
  let lastCollide = 0;

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text != null) node.textContent = text;
    return node;
  }

  // --- frames ----------------------------------------------------------------------------------
  document.addEventListener("kefu:frame", (e) => {
    const f = e.detail;
    switch (f.type) {
      case "ready":
        my.away = !!f.away;
        $("away").checked = my.away;
        return onTeam(f.team || []);
      case "team":
        return onTeam(f.agents || []);
      case "assignment":
        return onAssignment(f);
      case "collision":
        return onCollision(f);
      case "history":
        if (f.conversation === S.open) {
          renderCollision();
          setTimeout(renderAssignee); // after console.js took the row
        }
        return;
      case "status":
        if (f.conversation === S.open) setTimeout(renderAssignee);
        return;
    }
  });

  function onTeam(agents) {
    my.agents = agents;
    const list = $("team-list");
    list.replaceChildren(
      ...agents.map((a) => {
        const li = el("li", a.away ? "team__agent is-away" : "team__agent", a.id === S.myId ? `${a.name} (${t("you")})` : a.name);
        li.dataset.id = String(a.id);
        if (a.away) li.append(el("span", "team__away-tag", ` · ${t("away")}`));
        return li;
      }),
    );
    const mine = agents.find((a) => a.id === S.myId);
    if (mine) {
      my.away = mine.away;
      $("away").checked = my.away;
    }
    renderAssignTo();
  }

  function onAssignment(f) {
    let row = S.rows.get(f.conversation);
    if (f.info) row = Object.assign(row || {}, f.info);
    if (row) {
      row.assignee = f.assignee;
      S.rows.set(f.conversation, row);
    }
    const toMe = f.assignee && f.assignee.id === S.myId;
    if (!toMe) k.dropAlert(f.conversation); // the alert moves with the conversation
    if (toMe && f.previous !== S.myId && f.reason !== "take_over" && !my.away) {
      k.alertFor("assigned", f.conversation, f.note || "");
    }
    k.renderLists();
    if (f.conversation === S.open) {
      if (S.info) S.info.assignee = f.assignee;
      renderAssignee();
    }
  }

  // No alert while away; none for a conversation someone else owns (issue 32).
  document.addEventListener("kefu:alert", (e) => {
    if (my.away) return e.preventDefault();
    const row = e.detail.id && S.rows.get(e.detail.id);
    if (row && row.assignee && row.assignee.id !== S.myId) e.preventDefault();
  });

  // The assignee on each row of the list.
  document.addEventListener("kefu:row", (e) => {
    const { row, li } = e.detail;
    if (!row.assignee) return;
    const facts = li.querySelector(".queue__facts");
    const name = row.assignee.id === S.myId ? t("you") : row.assignee.name;
    const tag = el("span", "queue__assignee", `→ ${name}`);
    tag.title = t("assigned", { name: row.assignee.name });
    if (row.assignee.id === S.myId) li.classList.add("is-mine");
    (facts || li).append(tag);
  });

  // --- the open conversation: assignee, assign / transfer ---------------------------------------
  function renderAssignee() {
    const info = S.info || {};
    const a = info.assignee;
    $("detail-assignee").textContent = a ? t("assigned", { name: a.id === S.myId ? t("you") : a.name }) : t("unassigned");
    const closed = info.status === "closed";
    $("btn-assign-me").disabled = closed || !!(a && a.id === S.myId);
    $("btn-assign").disabled = closed;
    renderAssignTo();
  }

  function renderAssignTo() {
    const select = $("assign-to");
    const keep = select.value;
    const first = select.options[0];
    select.replaceChildren(first);
    for (const a of my.agents) {
      if (a.id === S.myId) continue;
      const o = el("option", null, a.away ? `${a.name} (${t("away")})` : a.name);
      o.value = String(a.id);
      select.append(o);
    }
    select.value = Array.from(select.options).some((o) => o.value === keep) ? keep : "";
  }

  function assignMe() {
    if (S.open) k.send({ type: "assign", conversation: S.open, agent: "me" });
  }
  $("btn-assign-me").addEventListener("click", assignMe);
  $("assign-form").addEventListener("submit", (e) => {
    e.preventDefault();
    if (!S.open) return;
    const to = $("assign-to").value;
    const note = $("assign-note").value.trim();
    if (k.send({ type: "assign", conversation: S.open, agent: to ? Number(to) : null, note })) {
      $("assign-note").value = "";
      $("assign-menu").open = false;
    }
  });

  $("away").addEventListener("change", (e) => {
    my.away = e.target.checked;
    k.send({ type: "away", away: my.away });
  });

  // --- collision: who else is viewing or typing ---------------------------------------------------
  function onCollision(f) {
    if (f.conversation !== S.open || f.agent_id === S.myId) return;
    const key = `${f.conversation} ${f.agent_id}`;
    if (f.what === "left") {
      others.delete(key);
    } else {
      const known = others.has(key);
      others.set(key, { cid: f.conversation, name: f.agent, what: f.what, until: Date.now() + (f.ttl_s || 30) * 1000 });
      // Someone just opened it: tell them at once that this agent is here too.
      if (!known && f.what === "viewing") k.send({ type: "collide", conversation: S.open, what: "viewing" });
    }
    renderCollision();
  }

  function renderCollision() {
    const now = Date.now();
    const parts = [];
    for (const [id, o] of others) {
      if (o.cid !== S.open) {
        others.delete(id); // another conversation's: this console no longer follows it
        continue;
      }
      if (o.until < now) {
        if (o.what === "typing") {
          o.what = "viewing"; // stopped typing: still there until the viewing mark runs out
          o.until = now + 20000;
        } else {
          others.delete(id);
          continue;
        }
      }
      parts.push(t(o.what === "typing" ? "typing" : "viewing", { name: o.name }));
    }
    $("collision").textContent = parts.join(" · ");
  }
  setInterval(renderCollision, 1000);

  function typed() {
    const now = Date.now();
    if (S.open && now - lastCollide > 3000 && k.send({ type: "collide", conversation: S.open, what: "typing" })) lastCollide = now;
  }
  $("reply").addEventListener("input", typed);
  $("note").addEventListener("input", typed);

  // --- keyboard ----------------------------------------------------------------------------------
  function typingInField(target) {
    if (!target || !target.tagName) return false;
    const tag = target.tagName.toLowerCase();
    return tag === "input" || tag === "textarea" || tag === "select" || target.isContentEditable;
  }

  function step(by) {
    const items = Array.from(document.querySelectorAll(".queue__item"));
    if (!items.length) return;
    const at = items.findIndex((li) => li.dataset.id === S.open);
    const next = at < 0 ? (by > 0 ? 0 : items.length - 1) : Math.min(items.length - 1, Math.max(0, at + by));
    k.openConversation(items[next].dataset.id);
    const li = document.querySelector(`.queue__item[data-id="${items[next].dataset.id}"]`);
    if (li) li.scrollIntoView({ block: "nearest" });
  }

  function keys(show) {
    const box = $("keys");
    box.hidden = show === undefined ? !box.hidden : !show;
    if (!box.hidden) $("btn-keys-close").focus();
  }
  $("btn-keys").addEventListener("click", () => keys(true));
  $("btn-keys-close").addEventListener("click", () => keys(false));

  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && e.target === $("reply")) return; // console.js sends
    if (e.key === "Escape" && !$("keys").hidden) return keys(false);
    if (e.ctrlKey || e.metaKey || e.altKey || e.isComposing || typingInField(e.target)) return;
    const open = !!S.open && !$("detail").hidden;
    const actions = {
      "?": () => keys(),
      j: () => step(1),
      k: () => step(-1),
      t: () => open && !$("btn-take").disabled && k.take(),
      h: () => open && !$("btn-back").disabled && k.handBack(),
      c: () => open && !$("btn-close").disabled && k.close(),
      a: () => open && assignMe(),
      r: () => open && !$("reply").disabled && $("reply").focus(),
    };
    const act = actions[e.key];
    if (!act) return;
    e.preventDefault();
    act();
  });
})();
