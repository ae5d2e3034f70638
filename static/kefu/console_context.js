/* kefu agent console: labels, the customer's context and canned replies (templates/console.html,
   docs/console.md, issue 32). Talks to the console's JSON endpoints (/console/api/labels,
   /console/api/conversations/<id>/context and /labels, /console/api/canned); console.js tells it
   what happens with DOM events: "kefu:opened" (a conversation opened), "kefu:row" (a list row
   drawn: its labels are added here), "kefu:labels" (a conversation's labels changed, live).
   An earlier conversation opens in the console through "kefu:open-conversation", as a search
   result does. Strings come from Django's JavaScript catalog (gettext); every text is set with
   textContent, never parsed as HTML (strict CSP). */
(function () {
  "use strict";

  const bar = document.getElementById("labelbar");
  if (!bar) return;
  const gettext = window.gettext || ((s) => s);
  const interpolate = window.interpolate || ((fmt, obj) => fmt.replace(/%s/g, () => String(obj.shift())));
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text != null) node.textContent = text;
    return node;
  };
  const lang = document.documentElement.lang || undefined;

  const state = {
    labels: new Map(), // id -> {id, name, color}
    canManageLabels: false,
    filter: null, // label id the inbox is filtered by
    open: null, // the open conversation
    openLabels: [],
    // The open conversation's labels changed (a reply to this agent's change, or live) after its
    // context was asked for: the context's labels, read earlier, must not overwrite them.
    labelsChanged: false,
    canned: [], // the open conversation's replies: {id, title, shortcut, text (filled), shared}
    suggest: [], // the replies the suggestion list shows
    active: 0, // the highlighted suggestion
    replies: [], // the agent's replies as managed (chat.canned.reply_item)
    canManageShared: false,
    loadedAt: 0, // when the open conversation's context was read
  };

  async function api(url, method, body) {
    const init = { method: method || "GET", credentials: "same-origin", headers: { Accept: "application/json" } };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    if (init.method !== "GET") init.headers["X-CSRFToken"] = bar.dataset.csrf;
    const resp = await fetch(url, init);
    let data = {};
    try { data = await resp.json(); } catch (e) { /* not JSON: the status says it */ }
    if (!resp.ok) throw new Error((data.error && data.error.message) || String(resp.status));
    return data;
  }

  function when(iso) {
    const d = new Date(iso);
    return isNaN(d) ? "" : d.toLocaleString(lang, { dateStyle: "medium", timeStyle: "short" });
  }

  // --- labels ----------------------------------------------------------------------------------
  function chip(label, onRemove) {
    const c = el("span", "label-chip", label.name);
    c.style.setProperty("--label-color", label.color);
    c.dataset.label = String(label.id);
    if (onRemove) {
      const x = el("button", "label-chip__x", "×");
      x.type = "button";
      x.setAttribute("aria-label", interpolate(gettext("Remove label %s"), [label.name]));
      x.addEventListener("click", onRemove);
      c.append(x);
    }
    return c;
  }

  function chipsOf(ids) {
    const box = el("span", "label-chips");
    for (const id of ids || []) {
      const label = state.labels.get(id);
      if (label) box.append(chip(label));
    }
    return box;
  }

  async function loadLabels() {
    try {
      const data = await api("/console/api/labels");
      state.labels = new Map(data.labels.map((l) => [l.id, l]));
      state.canManageLabels = data.can_manage;
    } catch (e) {
      return;
    }
    $("btn-labels-manage").hidden = !state.canManageLabels;
    const filter = $("label-filter");
    filter.replaceChildren(new Option(gettext("All conversations"), ""));
    for (const l of state.labels.values()) filter.append(new Option(l.name, String(l.id)));
    if (state.filter && state.labels.has(state.filter)) filter.value = String(state.filter);
    else setFilter(null);
    renderOpenLabels();
    redrawRowChips();
  }

  function redrawRowChips() {
    // Rows drawn before the labels arrived: ask console.js to draw the list again is not
    // possible from here, so add the chips to the rows already on the page.
    for (const btn of document.querySelectorAll("#queue .queue__btn[data-labels]")) {
      const old = btn.querySelector(".label-chips");
      if (old) old.remove();
      btn.append(chipsOf(JSON.parse(btn.dataset.labels)));
    }
  }

  document.addEventListener("kefu:row", (e) => {
    const { row, el: btn } = e.detail;
    btn.dataset.labels = JSON.stringify(row.labels || []);
    if (row.labels && row.labels.length) btn.append(chipsOf(row.labels));
  });

  document.addEventListener("kefu:labels", (e) => {
    if (e.detail.id === state.open) {
      state.openLabels = e.detail.labels;
      state.labelsChanged = true;
      renderOpenLabels();
    }
    if (state.filter) loadFilter();
  });

  function renderOpenLabels() {
    const box = $("ctx-label-chips");
    box.replaceChildren();
    for (const id of state.openLabels) {
      const label = state.labels.get(id);
      if (label) box.append(chip(label, () => setLabel(id, false)));
    }
    const add = $("ctx-label-add");
    add.replaceChildren(new Option(gettext("+ Label"), ""));
    for (const l of state.labels.values()) if (!state.openLabels.includes(l.id)) add.append(new Option(l.name, String(l.id)));
    $("ctx-labels").hidden = state.labels.size === 0;
  }

  async function setLabel(id, on) {
    const cid = state.open;
    try {
      const data = await api(`/console/api/conversations/${cid}/labels`, "POST", { label: id, on });
      if (cid === state.open) {
        state.openLabels = data.labels;
        state.labelsChanged = true;
        renderOpenLabels();
      }
    } catch (e) {
      /* the next open shows the stored labels */
    }
  }

  $("ctx-label-add").addEventListener("change", (e) => {
    const id = Number(e.target.value);
    e.target.value = "";
    if (id) setLabel(id, true);
  });

  // The inbox filtered by a label: a list of its own (the sections are hidden meanwhile).
  function setFilter(id) {
    state.filter = id;
    $("queue").classList.toggle("queue--filtered", !!id);
    $("labelview").hidden = !id;
    if (id) loadFilter();
  }

  async function loadFilter() {
    const id = state.filter;
    const label = state.labels.get(id);
    $("labelview-name").textContent = label ? label.name : "";
    let data;
    try {
      data = await api(`/console/api/labels/${id}/conversations`);
    } catch (e) {
      return;
    }
    if (id !== state.filter) return;
    const list = $("labelview-list");
    list.replaceChildren();
    $("labelview-count").textContent = String(data.conversations.length);
    $("labelview-empty").hidden = data.conversations.length > 0;
    for (const row of data.conversations) {
      const li = el("li", "queue__item");
      li.dataset.id = row.id;
      li.dataset.status = row.status;
      const btn = el("button", "queue__btn");
      btn.type = "button";
      const name = (row.customer && row.customer.name) || row.contact_email || `${gettext("Visitor")} · ${row.id.slice(0, 8)}`;
      const head = el("span", "queue__head");
      head.append(el("span", "queue__name", name));
      btn.append(head);
      if (row.last_shopper && row.last_shopper.text) btn.append(el("span", "queue__last", row.last_shopper.text));
      btn.append(chipsOf(row.labels));
      btn.addEventListener("click", () => document.dispatchEvent(new CustomEvent("kefu:open-conversation", { detail: { id: row.id } })));
      li.append(btn);
      list.append(li);
    }
  }

  $("label-filter").addEventListener("change", (e) => setFilter(e.target.value ? Number(e.target.value) : null));

  // Managing labels (staff with chat.manage_labels).
  function renderLabelManager() {
    const list = $("labels-manage-list");
    list.replaceChildren();
    for (const l of state.labels.values()) {
      const li = el("li", "ctx-dialog__item");
      const name = el("input");
      name.value = l.name;
      name.maxLength = 40;
      name.setAttribute("aria-label", gettext("Name"));
      const color = el("input");
      color.type = "color";
      color.value = l.color;
      color.setAttribute("aria-label", gettext("Colour"));
      const save = el("button", "btn", gettext("Save"));
      save.type = "button";
      save.addEventListener("click", () => manageLabel(`/console/api/labels/${l.id}`, "POST", { name: name.value, color: color.value }));
      const del = el("button", "btn btn--link", gettext("Delete"));
      del.type = "button";
      del.addEventListener("click", () => {
        if (window.confirm(interpolate(gettext("Delete the label %s from every conversation?"), [l.name]))) {
          manageLabel(`/console/api/labels/${l.id}`, "DELETE");
        }
      });
      li.append(name, color, save, del);
      list.append(li);
    }
  }

  async function manageLabel(url, method, body) {
    $("labels-error").textContent = "";
    try {
      await api(url, method, body);
    } catch (e) {
      $("labels-error").textContent = e.message;
      return false;
    }
    await loadLabels();
    renderLabelManager();
    return true;
  }

  $("btn-labels-manage").addEventListener("click", () => {
    renderLabelManager();
    $("labels-dialog").showModal();
  });
  $("labels-dialog-close").addEventListener("click", () => $("labels-dialog").close());
  $("label-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    if (await manageLabel("/console/api/labels", "POST", { name: $("label-name").value, color: $("label-color").value })) {
      $("label-name").value = "";
    }
  });

  // --- the customer's context ------------------------------------------------------------------
  const STATUS = {
    bot: gettext("Bot"), waiting_agent: gettext("Waiting"), agent: gettext("With an agent"), closed: gettext("Closed"),
  };

  function renderEarlier(items) {
    const list = $("earlier-list");
    list.replaceChildren();
    $("earlier-hint").textContent = items.length ? "" : gettext("No earlier conversation of this customer.");
    for (const c of items) {
      const li = el("li", "earlier__item");
      const btn = el("button", "earlier__open");
      btn.type = "button";
      btn.dataset.conversation = c.id;
      btn.append(
        el("span", "earlier__meta", `${when(c.created_at)} · ${STATUS[c.status] || c.status}${c.match === "email" ? ` · ${gettext("same e-mail")}` : ""}`),
        el("span", "earlier__text", c.first_text || "—"),
      );
      btn.addEventListener("click", () => document.dispatchEvent(new CustomEvent("kefu:open-conversation", { detail: { id: c.id } })));
      const link = el("a", "earlier__transcript", gettext("Transcript"));
      link.href = c.transcript;
      link.target = "_blank";
      link.rel = "noopener";
      li.append(btn, link);
      list.append(li);
    }
  }

  async function loadContext(id) {
    state.open = id;
    state.openLabels = [];
    state.labelsChanged = false;
    state.canned = [];
    closeSuggest();
    renderOpenLabels();
    $("earlier-list").replaceChildren();
    $("earlier-hint").textContent = gettext("Loading…");
    let data;
    try {
      data = await api(`/console/api/conversations/${id}/context`);
    } catch (e) {
      if (id === state.open) $("earlier-hint").textContent = gettext("Could not load the customer’s context.");
      return;
    }
    if (id !== state.open) return;
    if (!state.labelsChanged) state.openLabels = data.labels;
    state.canned = data.canned;
    state.loadedAt = Date.now();
    renderOpenLabels();
    renderEarlier(data.earlier);
  }

  document.addEventListener("kefu:opened", (e) => loadContext(e.detail.id));

  // --- /shortcut in the reply box ----------------------------------------------------------------
  const reply = $("reply");
  const box = $("canned-suggest");

  // The "/word" being typed just before the caret, or null.
  function slashWord() {
    const upto = reply.value.slice(0, reply.selectionStart);
    const m = /(^|\s)\/([\w-]*)$/.exec(upto);
    return m ? { start: upto.length - m[2].length - 1, word: m[2].toLowerCase() } : null;
  }

  function closeSuggest() {
    state.suggest = [];
    box.hidden = true;
    box.replaceChildren();
  }

  function renderSuggest() {
    box.replaceChildren();
    state.suggest.forEach((c, i) => {
      const li = el("li", i === state.active ? "canned-suggest__item is-active" : "canned-suggest__item");
      li.setAttribute("role", "option");
      li.setAttribute("aria-selected", String(i === state.active));
      li.append(el("strong", null, `/${c.shortcut}`), el("span", "canned-suggest__title", c.title), el("span", "canned-suggest__text", c.text));
      li.addEventListener("mousedown", (e) => {
        e.preventDefault(); // keep the focus in the reply box
        state.active = i;
        insertActive();
      });
      box.append(li);
    });
    box.hidden = state.suggest.length === 0;
  }

  // A "/" starts a list: the replies are read again when the context is older than a few
  // seconds, so an order number named since the conversation opened fills {order_number}.
  async function refreshCanned() {
    const id = state.open;
    state.loadedAt = Date.now();
    try {
      const data = await api(`/console/api/conversations/${id}/context`);
      if (id !== state.open) return;
      state.canned = data.canned;
    } catch (e) {
      return;
    }
    if (!box.hidden || slashWord()) updateSuggest();
  }

  function updateSuggest() {
    const at = slashWord();
    if (!at) return closeSuggest();
    if (at.word === "" && state.open && Date.now() - state.loadedAt > 3000) refreshCanned();
    const found = state.canned.filter((c) => c.shortcut && c.shortcut.toLowerCase().startsWith(at.word));
    found.sort((a, b) => (a.shortcut.toLowerCase() === at.word ? -1 : 0) - (b.shortcut.toLowerCase() === at.word ? -1 : 0));
    state.suggest = found.slice(0, 8);
    state.active = 0;
    renderSuggest();
  }

  function insertActive() {
    const c = state.suggest[state.active];
    const at = slashWord();
    if (!c || !at) return closeSuggest();
    const end = reply.selectionStart;
    reply.value = reply.value.slice(0, at.start) + c.text + reply.value.slice(end);
    const caret = at.start + c.text.length;
    reply.setSelectionRange(caret, caret);
    closeSuggest();
    reply.dispatchEvent(new Event("input", { bubbles: true }));
    reply.focus();
  }

  reply.addEventListener("input", updateSuggest);
  reply.addEventListener("blur", () => setTimeout(closeSuggest, 150));
  // Captured before console.js's own Enter (send) on the reply box while the list is open.
  document.addEventListener("keydown", (e) => {
    if (e.target !== reply || box.hidden || !state.suggest.length || e.isComposing) return;
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      state.active = (state.active + (e.key === "ArrowDown" ? 1 : state.suggest.length - 1)) % state.suggest.length;
      renderSuggest();
    } else if (e.key === "Tab" || (e.key === "Enter" && !e.shiftKey)) {
      insertActive();
    } else if (e.key === "Escape") {
      closeSuggest();
    } else {
      return;
    }
    e.preventDefault();
    e.stopImmediatePropagation();
  }, true);

  // --- managing canned replies -------------------------------------------------------------------
  async function loadReplies() {
    try {
      const data = await api("/console/api/canned");
      state.replies = data.replies;
      state.canManageShared = data.can_manage_shared;
    } catch (e) {
      $("canned-error").textContent = e.message;
      return;
    }
    $("canned-shared-label").hidden = !state.canManageShared;
    const list = $("canned-manage-list");
    list.replaceChildren();
    for (const r of state.replies) {
      const li = el("li", "ctx-dialog__item");
      li.append(
        el("strong", null, r.shortcut ? `/${r.shortcut}` : "—"),
        el("span", "ctx-dialog__title", r.title),
        el("span", "ctx-dialog__scope", r.shared ? gettext("shared") : gettext("personal")),
      );
      if (r.editable) {
        const edit = el("button", "btn btn--link", gettext("Edit"));
        edit.type = "button";
        edit.addEventListener("click", () => editReply(r));
        const del = el("button", "btn btn--link", gettext("Delete"));
        del.type = "button";
        del.addEventListener("click", async () => {
          if (!window.confirm(interpolate(gettext("Delete the reply %s?"), [r.title]))) return;
          try {
            await api(`/console/api/canned/${r.id}`, "DELETE");
          } catch (e) {
            $("canned-error").textContent = e.message;
          }
          afterChange();
        });
        li.append(edit, del);
      }
      list.append(li);
    }
  }

  function editReply(r) {
    $("canned-id").value = r ? String(r.id) : "";
    $("canned-title").value = r ? r.title : "";
    $("canned-shortcut").value = r ? r.shortcut : "";
    $("canned-text").value = r ? r.text : "";
    $("canned-text-en").value = (r && r.texts.en) || "";
    $("canned-text-zh").value = (r && (r.texts.zh || r.texts["zh-hans"])) || "";
    $("canned-shared").checked = !!(r && r.shared);
    $("canned-shared").disabled = !!r; // a reply keeps its scope
    $("canned-error").textContent = "";
  }

  function afterChange() {
    loadReplies();
    if (state.open) loadContext(state.open); // the filled replies of the open conversation
  }

  $("canned-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const id = $("canned-id").value;
    const texts = {};
    if ($("canned-text-en").value.trim()) texts.en = $("canned-text-en").value;
    if ($("canned-text-zh").value.trim()) texts.zh = $("canned-text-zh").value;
    const body = {
      title: $("canned-title").value,
      shortcut: $("canned-shortcut").value,
      text: $("canned-text").value,
      texts,
      shared: $("canned-shared").checked,
    };
    $("canned-error").textContent = "";
    try {
      await api(id ? `/console/api/canned/${id}` : "/console/api/canned", "POST", body);
    } catch (err) {
      $("canned-error").textContent = err.message;
      return;
    }
    editReply(null);
    afterChange();
  });
  $("canned-new").addEventListener("click", () => editReply(null));
  $("btn-canned-manage").addEventListener("click", () => {
    editReply(null);
    loadReplies();
    $("canned-dialog").showModal();
  });
  $("canned-dialog-close").addEventListener("click", () => $("canned-dialog").close());

  loadLabels();
})();
