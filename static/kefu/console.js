/* kefu agent console (templates/console.html): the conversation list and one open conversation,
   live over /ws/agent/ (frames: docs/console.md). No framework, no inline script (strict CSP);
   every text is set with textContent, never parsed as HTML. */
(function () {
  "use strict";

  // The catalog's functions (Django's JavaScriptCatalog at /console/i18n/js/, loaded before this
  // script): the agent's language; the English text as it is when the catalog did not load.
  const gettext = window.gettext || ((s) => s);
  const interpolate = window.interpolate || ((fmt, obj, named) => {
    let i = 0;
    return named ? fmt.replace(/%\((\w+)\)s/g, (m, k) => String(obj[k])) : fmt.replace(/%s/g, () => String(obj[i++]));
  });
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text != null) node.textContent = text;
    return node;
  };

  const state = {
    ws: null,
    attempts: 0,
    me: null, // display name
    myId: null,
    rows: new Map(), // conversation id -> row (console list shape)
    // The list comes in pages (docs/console.md#paging): each section's count on the server, the
    // cursor of its next page (null: all loaded) and whether that page was asked for.
    counts: {},
    next: {},
    moreBusy: {},
    // The open conversation's history comes newest page first: the seq before which older
    // messages exist (null: none loaded yet), whether there are any, and whether a page is asked for.
    histBefore: null,
    histMore: false,
    histBusy: false,
    open: null, // followed conversation id
    // Conversations this agent holds with shopper messages it has not looked at yet (alerts).
    unread: new Set(),
    info: null, // its row
    msgs: new Map(), // message id -> {el, text, streaming}
    lastTypingAt: 0,
    maxChars: 2000,
    pendingWrong: null, // message id of a "Wrong answer" mark awaiting its reply
    // Agent messages sent but not acknowledged yet: client_id -> {frame, el}. They are resent,
    // with the same client_id, after a reconnect; the server stores each client_id once.
    pending: new Map(),
    // The shopper's orders panel: the open conversation's orders, the request id of the last
    // "orders" request, the order actions awaiting their reply (request_id -> {frame, number}; resent
    // with the same request_id after a reconnect, and the server changes an order once per id), and
    // the last result shown under each order (number -> {text, error}).
    orders: [],
    ordersReq: null,
    orderReqs: new Map(),
    orderNotes: new Map(),
  };

  function newClientId() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  const ROLE_LABEL = { shopper: gettext("Shopper"), bot: gettext("Bot"), agent: gettext("Agent"), system: gettext("Notice") };
  const ORDER_STATUS = {
    placed: gettext("Placed, not packed yet"),
    packed: gettext("Being packed"),
    shipped: gettext("Shipped"),
    delivered: gettext("Delivered"),
    cancelled: gettext("Cancelled"),
    returned: gettext("Returned"),
  };
  const ORDER_SOURCE = { verified: gettext("verified customer"), proved: gettext("proved in this chat"), none: "" };
  const ORDER_CONFIRM = {
    cancel: (n) => interpolate(gettext("Cancel order %s for the shopper? It is refunded in full and the shopper is told in this chat."), [n]),
    return: (n) => interpolate(gettext("Start a return of order %s for the shopper? The store sends them the label and they are told in this chat."), [n]),
  };
  // Dates in the orders panel, in the page's language (the agent's, from <html lang>).
  const ORDER_DATE = new Intl.DateTimeFormat(document.documentElement.lang || undefined, { dateStyle: "medium", timeStyle: "short" });
  const STATUS_LABEL = {
    bot: gettext("Bot is answering"),
    waiting_agent: gettext("Waiting for an agent"),
    agent: gettext("With an agent"),
    closed: gettext("Closed"),
  };

  // --- socket --------------------------------------------------------------------------------
  function connect() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${scheme}//${location.host}${document.body.dataset.wsPath || "/ws/agent/"}`);
    state.ws = ws;
    setConn(gettext("Connecting…"), "connecting");
    ws.addEventListener("open", () => {
      state.attempts = 0;
      setConn(gettext("Online"), "online");
    });
    ws.addEventListener("message", (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch (e) {
        return;
      }
      handle(frame);
    });
    ws.addEventListener("close", (event) => {
      state.ws = null;
      if (event.code === 4403) {
        setConn(gettext("Not allowed: sign in as an agent"), "offline");
        location.assign("/console/login/?next=/console/");
        return;
      }
      setConn(gettext("Offline — reconnecting…"), "offline");
      const delay = Math.min(15000, 500 * 2 ** state.attempts++) * (0.5 + Math.random() / 2);
      setTimeout(connect, delay);
    });
  }

  // The lease of this console (chat/presence.py): while the page is open it says it is here.
  let heartbeat = null;
  function startHeartbeat(seconds) {
    clearInterval(heartbeat);
    heartbeat = setInterval(() => send({ type: "heartbeat" }), Math.max(1, Number(seconds) || 10) * 1000);
  }

  function send(frame) {
    if (!state.ws || state.ws.readyState !== WebSocket.OPEN) return false;
    state.ws.send(JSON.stringify(frame));
    return true;
  }

  function setConn(text, kind) {
    const c = $("conn");
    c.textContent = text;
    c.dataset.state = kind;
  }

  // --- frames --------------------------------------------------------------------------------
  function handle(f) {
    // Every frame also goes to the console's other scripts (console_team.js: assignment, team,
    // collision), before this one handles it.
    document.dispatchEvent(new CustomEvent("kefu:frame", { detail: f }));
    switch (f.type) {
      case "ready":
        startHeartbeat(f.heartbeat_s);
        state.me = f.agent;
        state.myId = f.agent_id;
        state.maxChars = f.max_chars || state.maxChars;
        $("me").textContent = f.agent;
        fillCanned(f.canned || []);
        return;
      case "queue":
        state.rows.clear();
        for (const row of f.conversations) state.rows.set(row.id, row);
        state.counts = f.counts || {};
        state.next = f.next || {};
        state.moreBusy = {};
        state.closedAsked = false;
        renderLists();
        if (state.view === "closed") loadClosed();
        if (state.open) send({ type: "open", conversation: state.open }); // after a reconnect
        for (const p of state.pending.values()) send(p.frame); // unacknowledged messages, again
        for (const r of state.orderReqs.values()) send(r.frame); // order actions with no reply yet, again
        if (state.open) loadOrders();
        return;
      case "queue.page":
        for (const row of f.conversations) if (!state.rows.has(row.id)) state.rows.set(row.id, row);
        state.counts = f.counts || state.counts;
        state.next[f.status] = f.next ? f.next[f.status] : null;
        state.moreBusy[f.status] = false;
        return renderLists();
      case "queue.counts": {
        // A conversation this console does not list (past its loaded pages) started waiting: the
        // count rose. Notified and counted in the title; no banner, there is no row to open.
        const before = state.counts.waiting_agent;
        state.counts = f.counts;
        if (typeof before === "number" && (f.counts.waiting_agent || 0) > before && alertAllowed("waiting", null)) {
          const title = alertText("waitingMore", { count: f.counts.waiting_agent });
          desktopNotify("waiting", "list", title, "");
          beep();
        }
        return renderLists();
      }
      case "conversation.update":
        if (f.counts) state.counts = f.counts;
        else if (!f.status && !state.rows.has(f.conversation) && f.last_message && f.last_message.seq === 1) {
          state.counts.bot = (state.counts.bot || 0) + 1; // a new conversation (docs/console.md#paging)
          state.counts.open = (state.counts.open || 0) + 1;
        }
        return onUpdate(f);
      case "handoff":
        state.rows.set(f.conversation, f.info);
        renderLists();
        alertFor("waiting", f.conversation, f.packet && f.packet.shopper_request ? f.packet.shopper_request.text : "");
        notify(`${interpolate(gettext("New conversation waiting for an agent: %s"), [shortId(f.conversation)])}${f.packet && f.packet.shopper_request ? " — “" + f.packet.shopper_request.text + "”" : ""}`);
        if (f.conversation === state.open) showPacket(f.packet);
        return;
      case "error":
        if (state.histBusy && f.conversation === state.open) {
          state.histBusy = false;
          renderEdge();
        }
        if (f.request_id && state.orderReqs.has(f.request_id)) return orderFailed(f);
        if (f.request_id && f.request_id === state.ordersReq) return ordersFailed(f);
        notify(errorText(f), true);
        if (f.client_id) notSent(f.client_id, errorText(f));
        if (state.pendingWrong != null) wrongFailed();
        return;
    }
    if (f.type === "message" && f.client_id && state.pending.has(f.client_id)) {
      // One of this console's messages is stored (possibly in a conversation no longer open).
      state.pending.get(f.client_id).el.remove();
      state.pending.delete(f.client_id);
    }
    if (f.type === "order.action") return onOrderAction(f);
    if (f.conversation !== state.open) return;
    switch (f.type) {
      case "orders":
        return onOrders(f);
      case "history":
        return onHistory(f);
      case "history.page":
        return onHistoryPage(f);
      case "message":
        return onMessage(f);
      case "stream.start":
        return upsertMessage({ id: f.id, seq: f.seq, role: "bot", text: "", route: f.route, streaming: true });
      case "stream.delta":
        return onDelta(f);
      case "stream.end":
        // A bot answer may have started, advanced or ended the shopper's task.
        if (["action", "product", "faq", "decline"].includes(f.route) || String(f.route).startsWith("llm.")) loadTask();
        return upsertMessage({ id: f.id, seq: f.seq, role: "bot", text: f.text, route: f.route, cut: f.cut, cards: f.cards, streaming: false });
      case "status":
        return onStatus(f.status, f.agent || "");
      case "typing":
        return onTyping(f);
      case "note":
        return addNote(f);
      case "suggestion":
        return onSuggestion(f);
      case "cache.wrong.done":
        return onWrongDone(f);
    }
  }

  // The server's refusals in the agent's language, by code (chat/consumers/agent.py); a code not
  // listed here (e.g. "invalid", a developer's error) shows the server's own words.
  function errorText(f) {
    switch (f.code) {
      case "taken":
        return interpolate(gettext("%s is already handling this conversation"), [f.agent || "?"]);
      case "not_owner":
        return f.agent ? interpolate(gettext("%s is handling this conversation"), [f.agent]) : gettext("Take the conversation over first");
      case "not_found":
        return gettext("No such conversation");
      case "forbidden":
        return gettext("You are no longer an agent");
      case "not_cached":
        return gettext("This message was not served from the answer cache");
      case "too_large":
        return gettext("The reply was too large to send");
      default:
        return f.message || f.code;
    }
  }

  function onUpdate(f) {
    if (f.labels && !f.status && !f.last_message && !f.contact_email && !state.rows.has(f.conversation)) return;
    const row = state.rows.get(f.conversation) || {
      id: f.conversation, status: "bot", agent: "", waiting_since: null, updated_at: null, last_message: null,
    };
    // Its stored row (face: name, time zone, language; the holder) when the update brings it: a
    // conversation that appears live looks as it does after a reload, not a bare "Visitor".
    if (f.info) Object.assign(row, f.info);
    if (f.status) {
      row.status = f.status;
      if ((f.agent || "") !== row.agent) row.agent_id = f.info ? f.info.agent_id : null;
      row.agent = f.agent || "";
      if (f.status === "waiting_agent" && !row.waiting_since) row.waiting_since = new Date().toISOString();
      if (f.status !== "waiting_agent") row.waiting_since = null;
    }
    if (f.contact_email) row.contact_email = f.contact_email;
    // Labels (console_context.js draws them): a label change moves nothing in the list.
    if (f.labels) {
      row.labels = f.labels;
      document.dispatchEvent(new CustomEvent("kefu:labels", { detail: { id: row.id, labels: f.labels } }));
      if (!f.status && !f.last_message && !f.contact_email) return renderLists(); // no activity: the row keeps its place
    }
    if (f.last_message && (!row.last_message || f.last_message.seq >= row.last_message.seq)) row.last_message = f.last_message;
    row.updated_at = new Date().toISOString();
    if (f.last_message && f.last_message.role === "shopper") row.last_shopper = { text: f.last_message.text, at: row.updated_at };
    state.rows.set(row.id, row);
    if (f.status && f.status !== "waiting_agent") dropAlert(row.id, "waiting"); // taken, handed back or closed
    if (f.status && !(f.status === "agent" && row.agent === state.me)) {
      state.unread.delete(row.id); // no longer this agent's
      dropAlert(row.id, "unread");
    }
    if (f.last_message && f.last_message.role === "shopper" && row.status === "agent" && row.agent === state.me
      && (row.id !== state.open || document.hidden)) {
      state.unread.add(row.id);
      alertFor("unread", row.id, f.last_message.text);
    }
    renderLists();
    if (row.id === state.open) {
      state.info = row;
      renderStatus();
    }
  }

  // --- the list ------------------------------------------------------------------------------
  function shortId(id) {
    return String(id).slice(0, 8);
  }

  // "45 s", "3 min", "2 h 05", "4 d": units translated in the list's data-* attributes.
  function since(iso) {
    if (!iso) return "";
    const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return rowText("sec", { n: s });
    if (s < 3600) return rowText("min", { n: Math.floor(s / 60) });
    if (s < 86400) return rowText("hour", { n: Math.floor(s / 3600), m: String(Math.floor((s % 3600) / 60)).padStart(2, "0") });
    return rowText("day", { n: Math.floor(s / 86400) });
  }

  function rowText(key, vars) {
    const text = $("queue").dataset[key] || key;
    return text.replace(/\{(\w+)\}/g, (_, k) => (vars && vars[k] != null ? vars[k] : ""));
  }

  // The inbox's views (issue 31): Waiting, Mine (the conversations this agent holds), All open
  // (waiting, with an agent, bot) and Closed (newest first; its first page is asked for when its
  // tab opens). Each tab has its view's count on the server; each section pages on its own.
  const SECTIONS = [["waiting_agent", "waiting"], ["agent", "agent"], ["bot", "bot"], ["mine", "mine"], ["closed", "closed"]];
  const VIEW_KEY = "kefu.console.view";
  state.view = (() => {
    try {
      const v = localStorage.getItem(VIEW_KEY);
      return ["waiting", "mine", "open", "closed"].includes(v) ? v : "open";
    } catch (e) {
      return "open";
    }
  })();

  function isMine(row) {
    if (row.status !== "agent") return false;
    return row.agent_id != null && state.myId != null ? row.agent_id === state.myId : row.agent === state.me;
  }

  function setView(view) {
    state.view = view;
    try {
      localStorage.setItem(VIEW_KEY, view);
    } catch (e) {
      // private mode: the view lasts for this page only
    }
    if (view === "closed") loadClosed();
    renderLists();
  }

  function loadClosed() {
    if (state.closedAsked || !state.next.closed) return;
    state.closedAsked = true;
    loadMoreRows("closed");
  }

  for (const tab of document.querySelectorAll(".tabs__tab")) {
    tab.addEventListener("click", () => setView(tab.dataset.view));
    tab.addEventListener("keydown", (e) => {
      // Arrow keys move between the tabs (the WAI-ARIA tabs pattern).
      if (e.key !== "ArrowRight" && e.key !== "ArrowLeft") return;
      const tabs = Array.from(document.querySelectorAll(".tabs__tab"));
      const next = tabs[(tabs.indexOf(tab) + (e.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
      next.focus();
      setView(next.dataset.view);
    });
  }

  function renderLists() {
    const groups = { waiting_agent: [], agent: [], bot: [], mine: [], closed: [] };
    for (const row of state.rows.values()) {
      if (groups[row.status]) groups[row.status].push(row);
      if (isMine(row)) groups.mine.push(row);
    }
    groups.waiting_agent.sort((a, b) => String(a.waiting_since).localeCompare(String(b.waiting_since)));
    const recent = (a, b) => String(b.updated_at).localeCompare(String(a.updated_at));
    for (const status of ["agent", "bot", "mine", "closed"]) groups[status].sort(recent);
    const shown = {};
    for (const [status, id] of SECTIONS) {
      const list = $(`list-${id}`);
      list.replaceChildren(...groups[status].map(renderRow));
      const count = state.counts[status];
      shown[status] = typeof count === "number" ? Math.max(count, groups[status].length) : groups[status].length;
      const counter = $(`count-${id}`) || $(`count-${id}-list`);
      counter.textContent = String(shown[status]);
      const empty = $(`empty-${id}`);
      if (empty) empty.hidden = groups[status].length > 0 || !!state.next[status] || !!state.moreBusy[status];
      // The next page of this section, when the server has more than the console loaded.
      const more = $(`more-${id}`);
      if (more) {
        more.hidden = !state.next[status] || (status === "closed" && !state.closedAsked);
        more.disabled = !!state.moreBusy[status];
      }
    }
    $("count-mine-list").textContent = String(shown.mine);
    // Closed is counted up to 10,000 (a bounded query, chat.selectors.CLOSED_COUNT_CAP): at least that many.
    const closed = shown.closed >= 10000 ? `${shown.closed}+` : String(shown.closed);
    $("count-closed").textContent = closed;
    $("count-closed-list").textContent = closed;
    $("count-view-waiting").textContent = String(shown.waiting_agent);
    const open = state.counts.open;
    $("count-open").textContent = String(typeof open === "number" ? Math.max(open, shown.waiting_agent + shown.agent + shown.bot) : shown.waiting_agent + shown.agent + shown.bot);
    for (const tab of document.querySelectorAll(".tabs__tab")) {
      const on = tab.dataset.view === state.view;
      tab.setAttribute("aria-selected", on ? "true" : "false");
      tab.tabIndex = on ? 0 : -1;
    }
    $("queue").dataset.view = state.view;
    for (const section of document.querySelectorAll(".queue__section")) {
      section.hidden = !section.dataset.views.split(" ").includes(state.view);
    }
    renderTitle();
  }

  // --- alerts (docs/console.md#alerts) ----------------------------------------------------------
  // A conversation that starts waiting for a person, and a shopper message in a conversation this
  // agent holds but is not looking at: a desktop notification (only once the agent allowed them:
  // permission is asked by a button, never on load), a short synthesised sound (a per-agent
  // setting kept in this browser), the tab title's count and a banner that stays until the
  // conversation is opened or taken. Texts come translated in #alerts' data-* attributes.
  const ALERTS = $("alerts");
  const alertText = (key, vars) => (ALERTS.dataset[key] || key).replace(/\{(\w+)\}/g, (_, k) => (vars && vars[k] != null ? vars[k] : ""));
  const SOUND_KEY = "kefu.console.sound";

  // Who the shopper is: the verified customer's name, else the e-mail left, else "Visitor · time
  // zone · language" (what the widget reported; no IP geolocation).
  function displayName(row) {
    if (!row) return alertText("visitor");
    if (row.customer && row.customer.name) return row.customer.name;
    const email = row.contact_email || (row.customer && row.customer.email);
    if (email) return email;
    return [alertText("visitor"), row.time_zone, row.locale].filter(Boolean).join(" · ");
  }

  function waitingCount() {
    const counted = state.counts.waiting_agent;
    let listed = 0;
    for (const row of state.rows.values()) if (row.status === "waiting_agent") listed += 1;
    return typeof counted === "number" ? Math.max(counted, listed) : listed;
  }

  function renderTitle() {
    const n = waitingCount() + state.unread.size;
    document.title = n > 0 ? `(${n}) ${alertText("title")}` : alertText("title");
  }

  // Whether an alert may go to this agent: console_team.js cancels "kefu:alert" for an agent who
  // is away, and for a conversation assigned to someone else (issue 32).
  function alertAllowed(kind, id) {
    return document.dispatchEvent(new CustomEvent("kefu:alert", { detail: { kind, id }, cancelable: true }));
  }

  function alertFor(kind, id, text) {
    if (!alertAllowed(kind, id)) return;
    const row = state.rows.get(id);
    const looking = id === state.open && !document.hidden;
    const title = alertText(kind, { name: displayName(row) });
    if (!looking) showBanner(kind, id, title, text);
    desktopNotify(kind, id, title, text);
    beep();
    renderTitle();
  }

  function showBanner(kind, id, title, text) {
    dropAlert(id, kind);
    const li = el("li", `alert alert--${kind}`);
    li.dataset.id = id;
    li.dataset.kind = kind;
    li.append(el("strong", "alert__title", title));
    if (text) li.append(el("span", "alert__text", `“${text}”`));
    const open = el("button", "btn btn--primary alert__open", alertText("open"));
    open.type = "button";
    open.addEventListener("click", () => openConversation(id));
    const dismiss = el("button", "btn btn--link alert__dismiss", "×");
    dismiss.type = "button";
    dismiss.setAttribute("aria-label", alertText("dismiss"));
    dismiss.addEventListener("click", () => li.remove());
    li.append(open, dismiss);
    ALERTS.append(li);
  }

  // Remove the banners of conversation ``id`` (of one kind, or all), and refresh the title.
  function dropAlert(id, kind) {
    for (const li of Array.from(ALERTS.children)) if (li.dataset.id === id && (!kind || li.dataset.kind === kind)) li.remove();
    renderTitle();
  }

  function desktopNotify(kind, id, title, text) {
    if (!("Notification" in window) || Notification.permission !== "granted") return;
    try {
      const n = new Notification(title, { body: text || "", tag: `kefu-${kind}-${id}` });
      n.onclick = () => {
        window.focus();
        openConversation(id);
        n.close();
      };
    } catch (e) {
      // Some browsers allow notifications from a service worker only: the banner and title remain.
    }
  }

  function renderNotifyAsk() {
    const ask = $("btn-notify-ask");
    ask.hidden = !("Notification" in window) || Notification.permission !== "default";
  }
  $("btn-notify-ask").addEventListener("click", () => {
    // Asked only on this click (browsers ignore or penalise a request made on page load).
    Promise.resolve(Notification.requestPermission()).then((p) => {
      renderNotifyAsk();
      if (p === "denied") notify(alertText("denied"), true);
    });
  });
  renderNotifyAsk();

  function soundOn() {
    try {
      return localStorage.getItem(SOUND_KEY) !== "off";
    } catch (e) {
      return true;
    }
  }
  $("sound-on").checked = soundOn();
  $("sound-on").addEventListener("change", (e) => {
    try {
      localStorage.setItem(SOUND_KEY, e.target.checked ? "on" : "off");
    } catch (err) {
      // private mode: the setting lasts for this page only
    }
    if (e.target.checked) beep();
  });

  // Two short sine tones (880 Hz then 660 Hz, 120 ms each) made with WebAudio: no sound file.
  let audio = null;
  function beep() {
    if (!$("sound-on").checked) return;
    const Ctx = window.AudioContext || window.webkitAudioContext;
    if (!Ctx) return;
    try {
      audio = audio || new Ctx();
      if (audio.state === "suspended") audio.resume();
      const t0 = audio.currentTime;
      [880, 660].forEach((hz, i) => {
        const osc = audio.createOscillator();
        const gain = audio.createGain();
        const start = t0 + i * 0.14;
        osc.frequency.value = hz;
        gain.gain.setValueAtTime(0.0001, start);
        gain.gain.exponentialRampToValueAtTime(0.2, start + 0.02);
        gain.gain.exponentialRampToValueAtTime(0.0001, start + 0.12);
        osc.connect(gain).connect(audio.destination);
        osc.start(start);
        osc.stop(start + 0.13);
      });
    } catch (e) {
      // no audio output: the other alerts remain
    }
  }

  // Back on the tab with a conversation open: its new messages are read now.
  document.addEventListener("visibilitychange", () => {
    if (document.hidden || !state.open) return;
    state.unread.delete(state.open);
    dropAlert(state.open, "unread");
  });

  function loadMoreRows(status) {
    const after = state.next[status];
    if (!after || state.moreBusy[status]) return;
    if (send({ type: "queue.more", status, after })) {
      state.moreBusy[status] = true;
      renderLists();
    }
  }
  for (const [status, id] of SECTIONS) {
    const more = $(`more-${id}`);
    if (more) more.addEventListener("click", () => loadMoreRows(status));
  }

  function renderRow(row) {
    const li = el("li", "queue__item");
    li.dataset.id = row.id;
    li.dataset.status = row.status;
    if (row.id === state.open) li.classList.add("is-open");
    const btn = el("button", "queue__btn");
    btn.type = "button";
    // The shopper's face (issue 31): who (displayName), when they last wrote ("3 min"), how long
    // they have waited, their language, and their own last words (never a bot notice).
    const head = el("span", "queue__head");
    // An e-mail left for a reply is marked as one (✉): the agent may answer there.
    const byMail = !(row.customer && row.customer.name) && row.contact_email;
    const name = el("span", byMail ? "queue__name queue__contact" : "queue__name", byMail ? `✉ ${row.contact_email}` : displayName(row));
    name.title = shortId(row.id);
    head.append(name);
    const said = row.last_shopper;
    const at = (said && said.at) || row.updated_at;
    if (at) head.append(el("span", "queue__time", rowText("ago", { time: since(at) })));
    btn.append(head);
    const facts = el("span", "queue__head queue__facts");
    facts.append(el("span", "queue__lang", row.locale || ""));
    if (row.status === "waiting_agent") facts.append(el("span", "queue__wait", rowText("waiting", { time: since(row.waiting_since) })));
    if (row.status === "agent") facts.append(el("span", "queue__agent", row.agent || gettext("agent")));
    if (row.customer) facts.append(el("span", "queue__customer", "✔"));
    if (state.unread.has(row.id)) li.classList.add("is-unread");
    btn.append(facts);
    if (said && said.text) btn.append(el("span", "queue__last", said.text));
    btn.addEventListener("click", () => openConversation(row.id));
    li.append(btn);
    document.dispatchEvent(new CustomEvent("kefu:row", { detail: { row, el: btn, li } })); // labels: console_context.js; the assignee: console_team.js
    return li;
  }

  setInterval(renderLists, 15000); // refresh the "waiting 3m" labels

  // A search result (console_search.js) opens its conversation, closed ones included.
  document.addEventListener("kefu:open-conversation", (e) => openConversation(e.detail.id));

  // --- one conversation ------------------------------------------------------------------------
  // On a phone (docs/console.md, one column) the list and the open conversation take turns.
  const LAYOUT = document.querySelector(".layout");
  LAYOUT.dataset.pane = "list";
  $("btn-list").addEventListener("click", () => {
    LAYOUT.dataset.pane = "list";
    window.scrollTo(0, 0);
  });

  function openConversation(id) {
    state.open = id;
    state.unread.delete(id);
    dropAlert(id);
    state.info = state.rows.get(id) || null;
    state.msgs.clear();
    state.pendingWrong = null;
    state.replyCards = [];
    renderReplyCards();
    state.histBefore = null;
    state.histMore = false;
    state.histBusy = false;
    $("log").replaceChildren();
    $("notes").replaceChildren();
    $("packet").hidden = true;
    $("typing").hidden = true;
    $("reply").value = "";
    $("suggest-hint").textContent = "";
    state.orders = [];
    state.orderNotes.clear();
    $("orders-list").replaceChildren();
    $("orders-source").textContent = "";
    $("detail").hidden = false;
    $("empty").hidden = true;
    LAYOUT.dataset.pane = "detail"; // on a phone the conversation replaces the list
    $("detail-title").textContent = interpolate(gettext("Conversation %s"), [shortId(id)]);
    $("link-transcript").href = `/console/conversations/${id}/`;
    renderLists();
    renderStatus();
    send({ type: "open", conversation: id });
    loadOrders();
    loadTask();
    // The customer's context, labels and canned replies (console_context.js).
    document.dispatchEvent(new CustomEvent("kefu:opened", { detail: { id } }));
  }

  // --- the shopper's task across messages (docs/console.md, Task) --------------------------------
  // GET/POST /console/conversations/<id>/task; the labels come translated in the page (data-*).
  function taskLabel(name) {
    return $("task").dataset[name.replace(/-([a-z_])/g, (_, c) => c.toUpperCase())] || "";
  }

  function renderTask(task) {
    const box = $("task-text");
    $("btn-task-clear").hidden = !task;
    if (!task) {
      box.textContent = taskLabel("none");
      return;
    }
    const lines = [taskLabel(`intent-${task.intent}`) || task.intent, taskLabel(`awaiting-${task.awaiting}`)];
    if (task.order_number) lines.push(`${taskLabel("order")}: ${task.order_number}`);
    if (task.email) lines.push(`${taskLabel("email")}: ${task.email}`);
    lines.push(task.expired ? taskLabel("expired") : `${taskLabel("expires")}: ${new Date(task.expires_at).toLocaleTimeString()}`);
    box.textContent = lines.filter(Boolean).join(" · ");
  }

  function taskUrl() {
    return `/console/conversations/${state.open}/task`;
  }

  function loadTask() {
    if (!state.open) return;
    const id = state.open;
    fetch(taskUrl(), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
      .then((body) => { if (state.open === id) renderTask(body.task); })
      .catch(() => { $("task-text").textContent = taskLabel("failed"); });
  }

  function clearTask() {
    if (!state.open) return;
    const body = new URLSearchParams({ clear: "1" });
    fetch(taskUrl(), {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": $("task").dataset.csrf, Accept: "application/json" },
      body,
    })
      .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
      .then(() => { renderTask(null); $("task-text").textContent = taskLabel("cleared"); })
      .catch(() => { $("task-text").textContent = taskLabel("failed"); });
  }

  function onHistory(f) {
    state.info = Object.assign({}, state.rows.get(f.conversation) || {}, f.info);
    const listed = state.rows.get(f.conversation);
    if (listed) {
      // The stored row's face (time zone, the shopper's last words) for a row that came live.
      for (const key of ["time_zone", "locale", "customer", "contact_email", "last_shopper"]) listed[key] = f.info[key];
      renderLists();
    }
    // The newest page. Sent again after a reconnect or a resync, it does not forget older pages
    // already loaded.
    if (state.histBefore == null || (f.before != null && f.before <= state.histBefore)) {
      state.histBefore = f.before;
      state.histMore = !!f.more;
    }
    for (const m of f.messages) upsertMessage(Object.assign({}, m, { streaming: m.state === "streaming" }));
    renderEdge();
    scrollLog(true);
    loadOlderIfShort();
    $("notes").replaceChildren();
    for (const n of f.notes) addNote(n);
    if (f.info.packet) showPacket(f.info.packet);
    renderStatus();
  }

  // An older page (reply to history.more): inserted above what is shown, the view kept where it was.
  function onHistoryPage(f) {
    const log = $("log");
    const fromBottom = log.scrollHeight - log.scrollTop;
    for (const m of f.messages) upsertMessage(Object.assign({}, m, { streaming: m.state === "streaming" }), true);
    if (f.before != null && (state.histBefore == null || f.before < state.histBefore)) state.histBefore = f.before;
    state.histMore = !!f.more;
    state.histBusy = false;
    renderEdge();
    log.scrollTop = log.scrollHeight - fromBottom;
    loadOlderIfShort();
  }

  // Scrolled to the top of the log: the page before the oldest message shown.
  function loadOlder() {
    if (!state.open || !state.histMore || state.histBusy || state.histBefore == null) return;
    if (send({ type: "history.more", conversation: state.open, before: state.histBefore })) {
      state.histBusy = true;
      renderEdge();
    }
  }

  function loadOlderIfShort() {
    const log = $("log");
    if (log.scrollHeight <= log.clientHeight) loadOlder(); // nothing to scroll yet: fill the view
  }

  $("log").addEventListener("scroll", () => {
    if ($("log").scrollTop < 80) loadOlder();
  });

  // The top line of the log: "loading earlier messages" while a page is on its way, "start of the
  // conversation" once the first message is shown (the history's end marker, more: false).
  function renderEdge() {
    const log = $("log");
    let edge = $("log-edge");
    if (!edge) {
      edge = el("li", "log__edge");
      edge.id = "log-edge";
      edge.dataset.seq = "0";
      edge.setAttribute("role", "status");
    }
    if (log.firstChild !== edge) log.insertBefore(edge, log.firstChild);
    const text = state.histBusy ? log.dataset.loadingText : !state.histMore && state.histBefore != null ? log.dataset.startText : "";
    edge.textContent = text || "";
    edge.hidden = !text;
  }

  function onMessage(f) {
    upsertMessage({ id: f.id, seq: f.seq, role: f.role, text: f.text, route: f.route, cut: f.cut, agent: f.agent, attachments: f.attachments, cards: f.cards, streaming: false });
    if (f.role === "shopper") $("typing").hidden = true;
  }

  function notSent(clientId, why) {
    const p = state.pending.get(clientId);
    if (!p) return;
    state.pending.delete(clientId);
    p.el.classList.add("msg--failed");
    p.el.querySelector(".msg__meta").textContent = interpolate(gettext("Not sent: %s"), [why]);
  }

  function onDelta(f) {
    const m = state.msgs.get(f.id);
    if (!m) return;
    const have = m.cp || 0; // code points shown (pos counts code points, not UTF-16 units)
    const points = Array.from(f.text);
    const pos = typeof f.pos === "number" ? f.pos : have;
    if (pos > have) {
      // Deltas were missed (docs/protocol.md, resync): the conversation's history again.
      if (state.open && Date.now() - (state.lastReopenAt || 0) > 2000) {
        state.lastReopenAt = Date.now();
        send({ type: "open", conversation: state.open });
      }
      return;
    }
    if (pos + points.length <= have) return; // already shown (history raced the live stream)
    m.text += pos < have ? points.slice(have - pos).join("") : f.text;
    m.cp = pos + points.length;
    m.body.textContent = m.text;
    scrollLog();
  }

  function upsertMessage(m, older) {
    let rec = state.msgs.get(m.id);
    if (!rec) {
      const li = el("li", `msg msg--${m.role}`);
      li.dataset.id = String(m.id);
      li.dataset.seq = String(m.seq);
      const meta = el("div", "msg__meta");
      const body = el("div", "msg__body");
      li.append(meta, body);
      rec = { el: li, meta, body, text: "", seq: m.seq };
      state.msgs.set(m.id, rec);
      // keep seq order (history and live frames may interleave)
      const log = $("log");
      const after = Array.from(log.children).find((c) => Number(c.dataset.seq) > m.seq);
      log.insertBefore(li, after || null);
    }
    rec.text = m.text || "";
    rec.cp = Array.from(rec.text).length;
    rec.body.textContent = rec.text;
    renderFiles(rec.body, m.attachments);
    renderCards(rec.body, m.cards);
    if (m.marked_wrong) rec.marked = true; // history: an agent already marked its cached answer wrong
    if (m.reason) rec.reason = m.reason; // history only: live frames are shared with the shopper and carry none
    rec.m = m.reason || !rec.reason ? m : { ...m, reason: rec.reason };
    renderMeta(rec, m.id);
    rec.el.classList.toggle("is-streaming", !!m.streaming);
    if (!older) scrollLog();
  }

  // --- product cards (docs/console.md, "Product cards"): every field set as text, never markup;
  // a link or image only over http(s) (a catalog path resolves against the store's own site, the
  // first of the page's data-store-origins, else is shown as text).
  const STORE_ORIGIN = (document.body.dataset.storeOrigin || "").trim();

  function cardAddress(value) {
    if (typeof value !== "string" || !value) return null;
    if (value.startsWith("/") && !value.startsWith("//") && !STORE_ORIGIN) return null;
    let url = null;
    try {
      url = new URL(value, STORE_ORIGIN || undefined);
    } catch (_) {
      return null;
    }
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  }

  function cardNode(c) {
    const card = el("div", "pcard");
    card.dataset.sku = String(c.sku || "");
    const src = cardAddress(c.image);
    if (src) {
      const img = el("img", "pcard__img");
      img.src = src;
      img.alt = String(c.title || "");
      img.loading = "lazy";
      img.referrerPolicy = "no-referrer";
      card.append(img);
    }
    const body = el("div", "pcard__body");
    body.append(el("div", "pcard__title", String(c.title || "")));
    const line = [String(c.price_text || ""), String(c.sku || "")].filter(Boolean).join(" · ");
    body.append(el("div", "pcard__price", line));
    if (typeof c.stock === "number") {
      body.append(el("div", "pcard__stock", c.stock > 0 ? interpolate(gettext("In stock: %s"), [c.stock]) : gettext("Out of stock")));
    }
    if (typeof c.description === "string" && c.description) body.append(el("p", "pcard__desc", c.description));
    const href = cardAddress(c.url);
    if (href) {
      const a = el("a", "pcard__link", gettext("Product page"));
      a.href = href;
      a.target = "_blank";
      a.rel = "noopener noreferrer nofollow";
      body.append(a);
    }
    card.append(body);
    return card;
  }

  function renderCards(body, cards) {
    if (!Array.isArray(cards) || !cards.length) return;
    const box = el("div", "pcards");
    for (const c of cards.slice(0, 3)) if (c && typeof c === "object") box.append(cardNode(c));
    body.append(box);
  }

  // The product lookup (GET /console/api/products): a result's "Insert" adds its card to the
  // reply being written (at most 3); the server builds the cards again from the catalog by SKU.
  state.replyCards = [];
  let productTimer = null;
  let productSeq = 0;

  function renderReplyCards() {
    const box = $("reply-cards");
    box.replaceChildren();
    for (const c of state.replyCards) {
      const chip = el("li", "reply-card");
      chip.dataset.sku = c.sku;
      chip.append(el("span", null, `${c.title} · ${c.price_text}`));
      const x = el("button", "btn btn--link", gettext("Remove"));
      x.type = "button";
      x.addEventListener("click", () => {
        state.replyCards = state.replyCards.filter((r) => r.sku !== c.sku);
        renderReplyCards();
      });
      chip.append(x);
      box.append(chip);
    }
    box.hidden = !state.replyCards.length;
  }

  async function lookUpProducts() {
    const q = $("product-q").value.trim();
    const list = $("product-results");
    const status = $("product-status");
    const mySeq = ++productSeq;
    if (!q) {
      list.replaceChildren();
      status.textContent = "";
      return;
    }
    const locale = (state.info && state.info.locale) || "en";
    let results = [];
    try {
      const r = await fetch(`/console/api/products?q=${encodeURIComponent(q)}&locale=${encodeURIComponent(locale)}`, { credentials: "same-origin" });
      if (!r.ok) throw new Error(String(r.status));
      results = (await r.json()).results || [];
    } catch (e) {
      if (mySeq === productSeq) status.textContent = interpolate(gettext("Product lookup failed: %s"), [e.message]);
      return;
    }
    if (mySeq !== productSeq) return;
    list.replaceChildren();
    status.textContent = results.length ? "" : gettext("No product found");
    for (const c of results) {
      const li = el("li", "product-hit");
      li.append(cardNode(c));
      const add = el("button", "btn", gettext("Insert card"));
      add.type = "button";
      add.dataset.sku = String(c.sku);
      add.addEventListener("click", () => {
        if (state.replyCards.some((r) => r.sku === c.sku)) return;
        if (state.replyCards.length >= 3) return notify(gettext("At most 3 product cards a message"), true);
        state.replyCards.push(c);
        renderReplyCards();
        $("reply").focus();
      });
      li.append(add);
      list.append(li);
    }
  }
  $("product-q").addEventListener("input", () => {
    clearTimeout(productTimer);
    productTimer = setTimeout(lookUpProducts, 250);
  });
  $("product-q").addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      clearTimeout(productTimer);
      lookUpProducts();
    }
  });

  // --- attachments (docs/console.md, "Photos"): thumbnails that open in a new tab; an agent
  // sends a picture by uploading it (the console's session) and then a message naming it.
  function renderFiles(body, files) {
    if (!Array.isArray(files) || !files.length) return;
    const box = el("div", "msg__files");
    for (const f of files) {
      const a = el("a", "msg__file");
      a.href = f.url;
      a.target = "_blank";
      a.rel = "noopener noreferrer";
      if (String(f.content_type || "").startsWith("image/")) {
        const img = el("img", "msg__thumb");
        img.src = f.url;
        img.alt = interpolate(gettext("Picture: %s"), [f.name]);
        img.loading = "lazy";
        a.append(img);
      } else {
        a.textContent = f.name;
      }
      box.append(a);
    }
    body.append(box);
  }

  async function sendPicture(file) {
    if (!file || !mine()) return;
    const data = new FormData();
    data.append("file", file, file.name || "picture");
    notify(gettext("Uploading…"));
    let body = {};
    let response;
    try {
      response = await fetch("/api/chat/attachments", {
        method: "POST",
        body: data,
        credentials: "same-origin",
        headers: { "X-Kefu-Conversation": state.open },
      });
      body = await response.json();
    } catch (e) {
      response = null;
    }
    if (!response || response.status !== 201) {
      const why = (body.error && body.error.message) || gettext("try again");
      return notify(interpolate(gettext("The picture could not be sent: %s"), [why]), true);
    }
    $("notify").hidden = true;
    const frame = { type: "message", conversation: state.open, client_id: newClientId(), text: "", attachments: [body.id] };
    const li = el("li", "msg msg--agent msg--pending");
    li.dataset.seq = String(Number.MAX_SAFE_INTEGER);
    li.append(el("div", "msg__meta", gettext("Sending…")), el("div", "msg__body", body.name));
    $("log").append(li);
    scrollLog();
    state.pending.set(frame.client_id, { frame, el: li });
    send(frame);
  }

  function renderMeta(rec, id) {
    const m = rec.m;
    const who = m.role === "agent" ? interpolate(gettext("%s (agent)"), [m.agent || gettext("Agent")]) : ROLE_LABEL[m.role] || m.role;
    rec.meta.replaceChildren(el("span", "msg__who", who));
    if (m.route) {
      const badge = el("span", "badge", m.route);
      if (m.reason) badge.title = interpolate(gettext("Why: %s"), [m.reason]);
      rec.meta.append(badge);
      if (m.reason) rec.meta.append(el("span", "route-reason", m.reason));
    }
    if ((m.flags || []).includes("prompt_injection")) {
      // The shopper tried to override the assistant's instructions (routing/decide/injection.py).
      rec.meta.append(el("span", "badge badge--warn", gettext("possible prompt injection")));
    }
    if (m.superseded) rec.meta.append(el("span", "badge", gettext("dropped: the shopper kept typing")));
    else if (m.cut) rec.meta.append(el("span", "badge badge--warn", gettext("cut")));
    if (rec.marked) {
      rec.meta.append(el("span", "badge badge--warn", gettext("marked wrong")));
    } else if (m.role === "bot" && !m.streaming && (m.cached || String(m.route || "").startsWith("cache."))) {
      rec.meta.append(wrongButton(id));
    }
  }

  // "Wrong answer" on a bot answer served from the answer cache: evicts the cached entry (any agent
  // may, not only the holder). A real <button>: reachable with Tab, activated with Enter or Space.
  function wrongButton(id) {
    const btn = el("button", "btn btn--link msg__wrong", gettext("Wrong answer"));
    btn.type = "button";
    btn.title = gettext("This cached answer is wrong: remove it from the answer cache");
    btn.setAttribute("aria-label", gettext("Mark this cached answer wrong and remove it from the answer cache"));
    btn.addEventListener("click", () => {
      if (state.pendingWrong != null) return;
      if (send({ type: "cache.wrong", conversation: state.open, message: id })) {
        state.pendingWrong = id;
        btn.disabled = true;
        btn.textContent = gettext("Marking…");
      }
    });
    return btn;
  }

  function onWrongDone(f) {
    if (state.pendingWrong === f.message) state.pendingWrong = null;
    const rec = state.msgs.get(f.message);
    if (rec) {
      rec.marked = true;
      renderMeta(rec, f.message);
    }
    notify(f.evicted ? gettext("Marked wrong: removed from the answer cache; the next shopper who asks gets a fresh answer.")
      : gettext("Marked wrong: this answer had already left the answer cache."));
  }

  function wrongFailed() {
    const rec = state.msgs.get(state.pendingWrong);
    const id = state.pendingWrong;
    state.pendingWrong = null;
    if (rec) renderMeta(rec, id); // the control again, enabled
  }

  // Follow the newest message, unless the agent scrolled up to read older ones.
  function scrollLog(force) {
    const log = $("log");
    if (force || log.scrollHeight - log.scrollTop - log.clientHeight < 200) log.scrollTop = log.scrollHeight;
  }

  function onStatus(status, agent) {
    if (!state.info) state.info = { id: state.open };
    state.info.status = status;
    state.info.agent = agent;
    renderStatus();
  }

  function mine() {
    return !!state.info && state.info.status === "agent" && state.info.agent === state.me;
  }

  function renderStatus() {
    const info = state.info || {};
    const status = info.status || "bot";
    let text = STATUS_LABEL[status] || status;
    if (status === "agent") text += `: ${info.agent === state.me ? gettext("you") : info.agent}`;
    if (info.contact_email) text += ` · ${interpolate(gettext("reply by e-mail: %s"), [info.contact_email])}`;
    $("detail-status").textContent = text;
    // The customer the store's signed identity token named (never typed by the shopper).
    const c = info.customer;
    $("detail-customer").textContent = c
      ? interpolate(gettext("Verified customer: %(name)s%(email)s · id %(id)s"),
        { name: c.name || gettext("(no name)"), email: c.email ? ` <${c.email}>` : "", id: c.id }, true)
      : gettext("Anonymous shopper (not signed in)");
    $("detail").dataset.status = status;
    $("btn-take").disabled = status === "agent";
    $("btn-back").disabled = !mine();
    $("btn-close").disabled = status === "closed" || (status === "agent" && !mine());
    $("reply").disabled = !mine();
    $("btn-send").disabled = !mine();
    $("reply").placeholder = mine() ? gettext("Reply to the shopper (Enter to send, Shift+Enter for a new line)") : gettext("Take the conversation over to reply");
    renderOrders(); // its buttons are for the agent holding the conversation
  }

  // --- the shopper's orders (docs/console.md, Orders) -------------------------------------------
  function loadOrders() {
    if (!state.open) return;
    $("orders").hidden = false;
    $("orders-hint").textContent = gettext("Loading…");
    state.ordersReq = newClientId();
    if (!send({ type: "orders", conversation: state.open, request_id: state.ordersReq })) {
      $("orders-hint").textContent = gettext("Offline: the orders load when the console is back online.");
    }
  }

  function onOrders(f) {
    state.orders = f.orders || [];
    $("orders-source").textContent = ORDER_SOURCE[f.source] ? `(${ORDER_SOURCE[f.source]})` : "";
    $("orders-hint").textContent = state.orders.length ? ""
      : f.source === "none" ? gettext("Anonymous shopper: no order proved in this chat (the bot asks for the order number and its e-mail address).")
        : gettext("No orders.");
    renderOrders();
  }

  function ordersFailed(f) {
    state.ordersReq = null;
    $("orders-hint").textContent = f.code === "not_configured" ? gettext("No store is connected.") : interpolate(gettext("Orders unavailable: %s"), [f.message || f.code]);
  }

  function renderOrders() {
    $("orders-list").replaceChildren(...state.orders.map(renderOrder));
  }

  function renderOrder(o) {
    const li = el("li", "order");
    li.dataset.status = o.status;
    const head = el("div", "order__head");
    head.append(el("span", "order__number", o.number), el("span", "order__status", ORDER_STATUS[o.status] || o.status));
    li.append(head);
    const placed = new Date(o.placed_at);
    const placedText = isNaN(placed) ? "" : ORDER_DATE.format(placed);
    li.append(el("div", "order__meta", interpolate(gettext("%(total)s %(currency)s · placed %(date)s"),
      { total: o.total, currency: o.currency, date: placedText }, true)));
    if ((o.items || []).length) {
      const items = el("ul", "order__items");
      for (const it of o.items) items.append(el("li", null, `${it.quantity} × ${it.title}`));
      li.append(items);
    }
    if (o.tracking) {
      const track = el("div", "order__track", `${o.tracking.carrier} `);
      if (/^https?:\/\//i.test(o.tracking.url || "")) {
        const a = el("a", null, o.tracking.number);
        a.href = o.tracking.url;
        a.target = "_blank";
        a.rel = "noopener noreferrer";
        track.append(a);
      } else {
        track.append(document.createTextNode(o.tracking.number));
      }
      li.append(track);
    }
    for (const r of o.refunds || []) li.append(el("div", "order__refund", interpolate(gettext("Refund %(amount)s %(currency)s: %(status)s"), { amount: r.amount, currency: o.currency, status: r.status }, true)));
    const busy = Array.from(state.orderReqs.values()).some((r) => r.number === o.number);
    const actions = el("div", "order__actions");
    actions.append(orderButton(o, "cancel", gettext("Cancel"), o.can_cancel, busy), orderButton(o, "return", gettext("Start return"), o.can_return, busy));
    li.append(actions);
    const note = state.orderNotes.get(o.number);
    const result = el("p", `order__result${note && note.error ? " is-error" : ""}`, note ? note.text : "");
    result.setAttribute("role", "status");
    li.append(result);
    return li;
  }

  // Cancel / Start return: a change made for the shopper, asked first with confirm(); one request id
  // per click, so a resend after a reconnect changes the order once.
  function orderButton(o, action, label, possible, busy) {
    const btn = el("button", "btn", label);
    btn.type = "button";
    btn.disabled = !possible || busy || !mine();
    if (possible && !mine()) btn.title = gettext("Take the conversation over first");
    btn.addEventListener("click", () => {
      if (!mine() || !window.confirm(ORDER_CONFIRM[action](o.number))) return;
      const frame = { type: "order.action", conversation: state.open, order: o.number, action, request_id: newClientId() };
      state.orderReqs.set(frame.request_id, { frame, number: o.number });
      state.orderNotes.set(o.number, { text: send(frame) ? gettext("Working…") : gettext("Offline: sent when the console is back online.") });
      renderOrders();
    });
    return btn;
  }

  function onOrderAction(f) {
    const req = state.orderReqs.get(f.request_id);
    state.orderReqs.delete(f.request_id);
    if (f.conversation !== state.open || !f.order) return;
    const number = req ? req.number : f.order.number;
    state.orders = state.orders.map((o) => (o.number === number || o.number === f.order.number ? f.order : o));
    const done = {
      cancel: gettext("Cancelled. The shopper was told."),
      return: interpolate(gettext("Return %s opened. The shopper was told."), [f.return_id || ""]),
      change_address: gettext("Address changed. The shopper was told."),
    };
    state.orderNotes.set(f.order.number, { text: f.repeated ? gettext("Already done: nothing changed again.") : done[f.action] || gettext("Up to date.") });
    renderOrders();
  }

  function orderFailed(f) {
    const req = state.orderReqs.get(f.request_id);
    state.orderReqs.delete(f.request_id);
    if (f.conversation !== state.open) return;
    state.orderNotes.set(req.number, { text: interpolate(gettext("Not done: %s"), [f.message || f.code]), error: true });
    renderOrders();
  }

  function showPacket(p) {
    if (!p) return;
    $("packet").hidden = false;
    // rule_text and reason come in the agent's language (chat/staff_text.py); the rule's code stays.
    const rule = p.rule_text ? `${p.rule_text} (${p.rule})` : p.rule;
    const why = [rule && interpolate(gettext("Rule: %s"), [rule]), p.route && interpolate(gettext("route %s"), [p.route]), p.reason].filter(Boolean).join(" · ");
    $("packet-why").textContent = p.shopper_request ? interpolate(gettext("%(why)s — shopper: “%(text)s”"), { why, text: p.shopper_request.text }, true) : why;
    $("packet-summary").textContent = p.summary || "";
    $("packet-told").replaceChildren(...(p.bot_told || []).map((b) => el("li", null, `[${b.route}${b.cut ? `, ${gettext("cut")}` : ""}] ${b.text}`)));
  }

  let typingTimer = null;
  function onTyping(f) {
    if (f.role !== "shopper") return; // an agent's own typing echoes back through the conversation
    const t = $("typing");
    t.hidden = false;
    clearTimeout(typingTimer);
    typingTimer = setTimeout(() => (t.hidden = true), 4000);
  }

  function addNote(n) {
    const li = el("li", "note");
    li.append(el("strong", null, n.author), document.createTextNode(`: ${n.text}`));
    $("notes").append(li);
  }

  function onSuggestion(f) {
    if (f.text) {
      $("reply").value = f.text; // a draft: the agent edits it and sends it, never sent on its own
      $("suggest-hint").textContent = interpolate(gettext("Draft from %s — edit before sending"), [f.route]);
      $("reply").focus();
    } else {
      $("suggest-hint").textContent = gettext("No suggestion for this conversation");
    }
  }

  let notifyTimer = null;
  function notify(text, isError) {
    const n = $("notify");
    n.textContent = text;
    n.hidden = false;
    n.classList.toggle("is-error", !!isError);
    clearTimeout(notifyTimer);
    notifyTimer = setTimeout(() => (n.hidden = true), 8000);
  }

  function fillCanned(items) {
    const select = $("canned");
    select.replaceChildren(el("option", null, "—"));
    select.firstChild.value = "";
    for (const c of items) {
      const o = el("option", null, c.title);
      o.value = c.text;
      select.append(o);
    }
  }

  // --- controls ------------------------------------------------------------------------------
  $("btn-take").addEventListener("click", () => send({ type: "take_over", conversation: state.open }));
  $("btn-back").addEventListener("click", () => send({ type: "hand_back", conversation: state.open }));
  $("btn-close").addEventListener("click", () => send({ type: "close", conversation: state.open }));
  $("btn-orders").addEventListener("click", () => { loadOrders(); loadTask(); });
  $("btn-task-clear").addEventListener("click", clearTask);
  $("btn-suggest").addEventListener("click", () => {
    $("suggest-hint").textContent = gettext("Drafting…");
    send({ type: "suggest", conversation: state.open });
  });
  $("canned").addEventListener("change", (event) => {
    const text = event.target.value;
    if (!text) return;
    const reply = $("reply");
    reply.value = reply.value ? `${reply.value} ${text}` : text;
    event.target.value = "";
    reply.focus();
  });

  function sendReply() {
    const reply = $("reply");
    const text = reply.value;
    const cards = state.replyCards.slice();
    if ((!text.trim() && !cards.length) || !mine()) return;
    if ([...text].length > state.maxChars) return notify(interpolate(gettext("At most %s characters"), [state.maxChars]), true);
    const frame = { type: "message", conversation: state.open, client_id: newClientId(), text };
    if (cards.length) frame.cards = cards.map((c) => c.sku);
    // Shown at once as "sending"; replaced by the stored message when the server acknowledges it,
    // resent after a reconnect until then (offline, it simply waits).
    const li = el("li", "msg msg--agent msg--pending");
    li.dataset.seq = String(Number.MAX_SAFE_INTEGER);
    const pendingBody = el("div", "msg__body", text);
    renderCards(pendingBody, cards);
    li.append(el("div", "msg__meta", gettext("Sending…")), pendingBody);
    $("log").append(li);
    scrollLog();
    state.pending.set(frame.client_id, { frame, el: li });
    send(frame);
    reply.value = "";
    state.replyCards = [];
    renderReplyCards();
    $("suggest-hint").textContent = "";
    state.lastTypingAt = 0; // the next message's typing is announced at once, not throttled
  }
  $("reply-file").addEventListener("change", (event) => {
    const file = event.target.files && event.target.files[0];
    event.target.value = "";
    sendPicture(file);
  });
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    sendReply();
  });
  $("reply").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      sendReply();
    }
  });
  $("reply").addEventListener("input", () => {
    const now = Date.now();
    if (mine() && $("reply").value.trim() && now - state.lastTypingAt > 2000) {
      if (send({ type: "typing", conversation: state.open })) state.lastTypingAt = now;
    }
  });
  $("note-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("note");
    if (input.value.trim() && state.open && send({ type: "note", conversation: state.open, text: input.value })) input.value = "";
  });

  // What the console's other scripts (console_team.js) may read and call.
  window.kefuConsole = {
    state, send, openConversation, alertFor, dropAlert, renderLists, notify, displayName, mine,
    take: () => $("btn-take").click(),
    handBack: () => $("btn-back").click(),
    close: () => $("btn-close").click(),
  };

  connect();
})();
