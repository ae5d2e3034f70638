/*!
 * kefu chat widget — speaks the shopper WebSocket protocol 1 (docs/protocol.md, docs/widget.md).
 *
 * Embed with one tag:  <script src="https://KEFU-HOST/static/kefu/widget.js" defer></script>
 *
 * - Plain ES2020, no build step, no dependency, no eval, no inline styles: it works under
 *   `script-src 'self'; style-src 'self'`. Its CSS (widget.css, next to this file) is loaded with a
 *   <link> inside an open Shadow DOM attached to a <kefu-chat> element at the end of <body>.
 * - Message text is never parsed as HTML: every node is built with textContent / createElement.
 * - State kept in localStorage under "kefu:v1:<server origin>:": the conversation id and token
 *   (never put in a URL), the outbox of unacknowledged messages, the last seq the shopper has seen.
 */
(() => {
  "use strict";

  if (window.kefu && window.kefu.__kefuWidget) return; // the tag was included twice

  // ---------------------------------------------------------------------------------------------
  // Where we were loaded from. document.currentScript is set for classic scripts, deferred or not.
  const script = document.currentScript || findOwnScript();
  if (!script || !script.src) {
    console.error("kefu: cannot find the widget's own <script> tag; the widget is disabled.");
    return;
  }
  const SRC = new URL(script.src, document.baseURI);
  const SERVER = new URL(script.dataset.server || SRC.origin, document.baseURI);
  const WS_URL = (SERVER.protocol === "https:" ? "wss://" : "ws://") + SERVER.host + "/ws/chat/";
  const CSS_URL = new URL("widget.css", SRC).href;
  // A signed identity token from the store's backend (data-identity, docs/security.md): sent in
  // the first hello of this page only; reconnects resume with the conversation token.
  let identityToken = script.dataset.identity || null;
  // A page of a signed-in customer keeps nothing of hers in storage, and sends nothing an earlier
  // page left there: on a shared computer the browser's stored conversation and unsent messages
  // may be someone else's (docs/security.md, "Shared computers").
  const SIGNED_IN = Boolean(identityToken);

  const MAX_CHARS = 2000; // code points, as the server counts them
  const COUNTER_FROM = 1800; // show the counter from here on
  // At most one typing frame a second while keys are pressed: the server's burst debounce takes
  // 2 s without one for a pause (KEFU_BURST_PAUSE_S).
  const TYPING_EVERY_MS = 1000;
  const BACKOFF_MIN_MS = 500;
  const BACKOFF_MAX_MS = 30000;
  const THINKING_TIMEOUT_MS = 45000;
  // An agent's typing frames come every 2 s while they type: the indicator outlives two of them.
  const AGENT_TYPING_MS = 5000;
  const ERROR_VISIBLE_MS = 10000;

  function findOwnScript() {
    const scripts = document.getElementsByTagName("script");
    for (let i = scripts.length - 1; i >= 0; i--) {
      if (/\/kefu\/widget(\.[\w-]+)?\.js(?:[?#]|$)/.test(scripts[i].src)) return scripts[i];
    }
    return null;
  }

  // ---------------------------------------------------------------------------------------------
  // i18n
  const STRINGS = {
    en: {
      title: "Chat with us",
      openChat: "Open chat",
      closeChat: "Close chat",
      askPerson: "Talk to a person",
      unread: (n) => (n === 1 ? "1 unread message" : `${n} unread messages`),
      subtitleIdle: "Questions about orders, delivery or products?",
      subtitleBot: "Our assistant replies instantly",
      subtitleWaiting: "Waiting for a person…",
      subtitleAgent: (name) => `Chatting with ${name}`,
      subtitleClosed: "Conversation closed",
      connecting: "Connecting…",
      reconnecting: "Reconnecting…",
      welcomeTitle: "Hi there!",
      welcomeText: "Ask us about an order, delivery, returns or any product. A person can take over whenever you need one.",
      log: "Messages",
      you: "You",
      bot: "Assistant",
      agent: "Agent",
      system: "Notice",
      staff: "Staff",
      inputLabel: "Your message",
      placeholder: "Type your message…",
      send: "Send",
      sending: "Sending…",
      notSent: "Not sent",
      retry: "Retry",
      loadEarlier: "Load earlier messages",
      loadingEarlier: "Loading earlier messages…",
      interrupted: "(interrupted)",
      thinking: "Assistant is typing",
      feedback: "Was this answer helpful?",
      helpful: "Helpful",
      notHelpful: "Not helpful",
      thanks: "Thanks for the feedback",
      hint: "Enter to send · Shift+Enter for a new line",
      counter: (n, max) => `${n.toLocaleString("en")} / ${max.toLocaleString("en")}`,
      counterUnit: " characters",
      tooLong: (max) => `Too long: ${max.toLocaleString("en")} characters at most.`,
      minutes: (s) => `about ${Math.max(1, Math.ceil(s / 60))} min`,
      subtitleQueue: (pos, wait) => `You're number ${pos} in the queue` + (wait ? ` · ${wait}` : ""),
      subtitleNoOne: "No one from our team is online right now",
      teamOnline: (n) => (n === 1 ? "1 person from our team is online" : `${n} people from our team are online`),
      teamOffline: "No one from our team is online",
      noticeWaiting: (pos, wait) =>
        `Waiting for a person from our team: you're number ${pos} in the queue` + (wait ? ` (${wait}).` : "."),
      contactPrompt: "No one is online to reply now. Leave your e-mail address and we'll answer there:",
      contactLabel: "Your e-mail address",
      contactSave: "Save",
      contactSaved: (email) => `Thanks! We'll reply to ${email}.`,
      contactInvalid: "Please enter a valid e-mail address.",
      notices: { starting: "We're just starting up. Your message is saved and we'll answer it in a moment." },
      noticeAgent: (name) => `${name} joined the conversation`,
      noticeAgentAnon: "An agent joined the conversation",
      noticeClosed: "The conversation was closed",
      csatAsk: "How satisfied are you with the help you got?",
      csatScore: (n) => ["", "Very unsatisfied", "Unsatisfied", "Neutral", "Satisfied", "Very satisfied"][n],
      csatThanks: "Thank you for telling us!",
      noticeBot: "You are chatting with our assistant again",
      noticeNew: "Your previous conversation has expired, so we started a new one.",
      attach: "Send a photo or PDF",
      attachUploading: (name) => `Uploading ${name}…`,
      attachAlt: (name) => `Photo: ${name}`,
      attachOpen: (name) => `Open ${name} in a new tab`,
      cardInStock: (n) => `In stock (${n})`,
      cardOutOfStock: "Out of stock",
      cardView: "View product",
      attachErrors: {
        too_large: "That file is too large (10 MB at most), or this chat holds too many files.",
        unsupported_type: "Only photos (JPEG, PNG, WebP, GIF, HEIC) and PDF files can be sent.",
        rate_limited: "You are sending files too quickly. Please wait a moment.",
        forbidden: "That file could not be sent in this chat.",
        generic: "The file could not be sent. Please try again.",
      },
      errors: {
        invalid: "That message could not be sent.",
        too_long: "That message is too long (2,000 characters at most).",
        rate_limited: "You are sending messages too quickly. Please wait a moment.",
        unavailable: "Sorry, we cannot answer right now. Please try again shortly.",
        generic: "Something went wrong. Please try again.",
      },
      said: (who, text) => `${who}: ${text}`,
    },
    zh: {
      title: "在线客服",
      openChat: "打开客服聊天",
      closeChat: "关闭客服聊天",
      askPerson: "转人工",
      unread: (n) => `${n} 条未读消息`,
      subtitleIdle: "订单、配送或商品有疑问？",
      subtitleBot: "智能助手即时回复",
      subtitleWaiting: "正在等待人工客服…",
      subtitleAgent: (name) => `正在与 ${name} 对话`,
      subtitleClosed: "对话已结束",
      connecting: "正在连接…",
      reconnecting: "正在重新连接…",
      welcomeTitle: "您好！",
      welcomeText: "订单、配送、退换货或商品的问题都可以问我们。需要时可随时转接人工客服。",
      log: "消息",
      you: "我",
      bot: "智能助手",
      agent: "客服",
      system: "通知",
      staff: "人工",
      inputLabel: "输入消息",
      placeholder: "请输入消息…",
      send: "发送",
      sending: "发送中…",
      notSent: "未发送",
      retry: "重试",
      loadEarlier: "加载更早的消息",
      loadingEarlier: "正在加载更早的消息…",
      interrupted: "（回答已中断）",
      thinking: "智能助手正在输入",
      feedback: "这条回答有帮助吗？",
      helpful: "有帮助",
      notHelpful: "没有帮助",
      thanks: "感谢您的反馈",
      hint: "Enter 发送 · Shift+Enter 换行",
      counter: (n, max) => `${n} / ${max}`,
      counterUnit: " 字",
      tooLong: (max) => `消息过长：最多 ${max} 字。`,
      minutes: (s) => `预计约 ${Math.max(1, Math.ceil(s / 60))} 分钟`,
      subtitleQueue: (pos, wait) => `您在队列中排第 ${pos} 位` + (wait ? ` · ${wait}` : ""),
      subtitleNoOne: "目前没有人工客服在线",
      teamOnline: (n) => `${n} 位人工客服在线`,
      teamOffline: "目前没有人工客服在线",
      noticeWaiting: (pos, wait) => `正在等待人工客服：您在队列中排第 ${pos} 位` + (wait ? `（${wait}）。` : "。"),
      contactPrompt: "目前没有客服在线。留下您的邮箱，我们会通过邮件回复您：",
      contactLabel: "您的邮箱",
      contactSave: "保存",
      contactSaved: (email) => `谢谢！我们会回复到 ${email}。`,
      contactInvalid: "请输入有效的邮箱地址。",
      notices: { starting: "系统正在启动，您的消息已保存，稍后马上为您解答。" },
      noticeAgent: (name) => `${name} 已加入对话`,
      noticeAgentAnon: "人工客服已加入对话",
      noticeClosed: "对话已结束",
      csatAsk: "您对本次服务满意吗？",
      csatScore: (n) => ["", "非常不满意", "不满意", "一般", "满意", "非常满意"][n],
      csatThanks: "感谢您的评价！",
      noticeBot: "您现在正在与智能助手对话",
      noticeNew: "之前的对话已过期，已为您开始新的对话。",
      attach: "发送图片或 PDF",
      attachUploading: (name) => `正在上传 ${name}…`,
      attachAlt: (name) => `图片：${name}`,
      attachOpen: (name) => `在新标签页中打开 ${name}`,
      cardInStock: (n) => `有货（${n} 件）`,
      cardOutOfStock: "暂时缺货",
      cardView: "查看商品",
      attachErrors: {
        too_large: "文件过大（最多 10 MB），或本次对话的文件已达上限。",
        unsupported_type: "只能发送图片（JPEG、PNG、WebP、GIF、HEIC）和 PDF 文件。",
        rate_limited: "您发送文件太快了，请稍候再试。",
        forbidden: "该文件无法在此对话中发送。",
        generic: "文件发送失败，请重试。",
      },
      errors: {
        invalid: "消息无法发送。",
        too_long: "消息过长（最多 2000 字）。",
        rate_limited: "您发送得太快了，请稍候再试。",
        unavailable: "抱歉，暂时无法回答，请稍后再试。",
        generic: "出错了，请重试。",
      },
      said: (who, text) => `${who}：${text}`,
    },
  };

  // The page's language (its primary subtag) goes to the server as the conversation's language;
  // the server detects each message's own language from there. The widget's own strings exist in
  // English and Chinese and fall back to English.
  function pickLocale() {
    const wanted = (script.dataset.locale || document.documentElement.lang || "en").toLowerCase();
    return wanted.split(/[-_]/)[0] || "en";
  }
  const LOCALE = pickLocale();
  const UI = STRINGS[LOCALE] ? LOCALE : "en";
  const T = STRINGS[UI];
  const TITLE = script.dataset.title || T.title;

  // ---------------------------------------------------------------------------------------------
  // Storage: localStorage namespaced per server origin, with an in-memory fallback (private modes,
  // sandboxed frames and blocked storage throw on access).
  const KEY = `kefu:v1:${SERVER.origin}:`;
  const storage = (() => {
    const memory = new Map();
    let ls = null;
    try {
      ls = window.localStorage;
      ls.setItem(KEY + "probe", "1");
      ls.removeItem(KEY + "probe");
    } catch (_) {
      ls = null;
    }
    return {
      get(name) {
        try {
          const raw = ls ? ls.getItem(KEY + name) : memory.get(name);
          return raw == null ? null : JSON.parse(raw);
        } catch (_) {
          return null;
        }
      },
      set(name, value) {
        const raw = JSON.stringify(value);
        try {
          if (ls) ls.setItem(KEY + name, raw);
          else memory.set(name, raw);
        } catch (_) {
          memory.set(name, raw);
        }
      },
      remove(name) {
        memory.delete(name);
        try {
          if (ls) ls.removeItem(KEY + name);
        } catch (_) {
          /* ignore */
        }
      },
    };
  })();

  // ---------------------------------------------------------------------------------------------
  // Small helpers
  function uuid() {
    const c = window.crypto;
    if (c && typeof c.randomUUID === "function") {
      try {
        return c.randomUUID();
      } catch (_) {
        /* insecure context: fall through */
      }
    }
    const bytes = new Uint8Array(16);
    if (c && typeof c.getRandomValues === "function") c.getRandomValues(bytes);
    else for (let i = 0; i < 16; i++) bytes[i] = Math.floor(Math.random() * 256);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  }

  /** Length in Unicode code points, as the server counts it. */
  function codePoints(text) {
    let n = 0;
    for (const _ of text) n++; // eslint-disable-line no-unused-vars
    return n;
  }

  function h(tag, className, text) {
    const el = document.createElement(tag);
    if (className) el.className = className;
    if (text != null) el.textContent = text;
    return el;
  }

  const SVG_NS = "http://www.w3.org/2000/svg";
  const ICONS = {
    chat: ["M21 11.5a8.38 8.38 0 0 1-.9 3.8 8.5 8.5 0 0 1-7.6 4.7 8.38 8.38 0 0 1-3.8-.9L3 21l1.9-5.7a8.38 8.38 0 0 1-.9-3.8 8.5 8.5 0 0 1 4.7-7.6 8.38 8.38 0 0 1 3.8-.9h.5a8.48 8.48 0 0 1 8 8v.5z"],
    close: ["M18 6 6 18", "M6 6l12 12"],
    clip: ["m21.44 11.05-9.19 9.19a6 6 0 0 1-8.49-8.49l9.19-9.19a4 4 0 0 1 5.66 5.66l-9.2 9.19a2 2 0 0 1-2.83-2.83l8.49-8.48"],
    minimize: ["m6 9 6 6 6-6"],
    send: ["M22 2 11 13", "M22 2 15 22 11 13 2 9 22 2z"],
    up: ["M7 10v12", "M15 5.88 14 10h5.83a2 2 0 0 1 1.92 2.56l-2.33 8A2 2 0 0 1 17.5 22H4a2 2 0 0 1-2-2v-8a2 2 0 0 1 2-2h2.76a2 2 0 0 0 1.79-1.11L12 2a3.13 3.13 0 0 1 3 3.88Z"],
    down: ["M17 14V2", "M9 18.12 10 14H4.17a2 2 0 0 1-1.92-2.56l2.33-8A2 2 0 0 1 6.5 2H20a2 2 0 0 1 2 2v8a2 2 0 0 1-2 2h-2.76a2 2 0 0 0-1.79 1.11L12 22a3.13 3.13 0 0 1-3-3.88Z"],
  };
  function icon(name) {
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    svg.setAttribute("class", `kefu-icon kefu-icon--${name}`);
    for (const d of ICONS[name]) {
      const path = document.createElementNS(SVG_NS, "path");
      path.setAttribute("d", d);
      svg.appendChild(path);
    }
    return svg;
  }

  // ---------------------------------------------------------------------------------------------
  // Rich text without HTML: line breaks, numbered and bulleted lists, **bold**, http(s) links.
  // Every piece of the message becomes a text node; nothing is ever parsed as markup.
  const NUMBERED = /^\s{0,3}(\d{1,3})(?:[.)]\s+|[、．]\s*)(\S.*)$/; // "1. a", "2) b", "3、c"
  const BULLET = /^\s{0,3}[-*•]\s+(\S.*)$/;
  const INLINE = /(https?:\/\/[^\s<>"'`]+)|\*\*([^*\n]+?)\*\*/g;
  const TRAILING_PUNCT = /[.,;:!?'")\]}，。；：！？）」』]+$/;

  // The domains a bot answer may link to (the `conversation` frame's `link_domains`: the store's
  // own and those it lists). A model answer's link to any other domain is shown as plain text: a
  // shopper may have talked the model into it (issue 29). Until the frame arrives: none.
  let linkDomains = [];

  function storeHost(url) {
    const host = url.hostname.toLowerCase().replace(/^\[|\]$/g, "").replace(/\.$/, "");
    return linkDomains.some((d) => host === d || host.endsWith(`.${d}`));
  }

  function appendInline(parent, text, storeLinksOnly) {
    let last = 0;
    INLINE.lastIndex = 0;
    let m;
    while ((m = INLINE.exec(text)) !== null) {
      let token = m[0];
      if (m[1]) {
        const trail = (token.match(TRAILING_PUNCT) || [""])[0];
        token = token.slice(0, token.length - trail.length);
      }
      if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      if (m[1]) {
        let url = null;
        try {
          url = new URL(token);
        } catch (_) {
          url = null;
        }
        if (url && (url.protocol === "http:" || url.protocol === "https:") && (!storeLinksOnly || storeHost(url))) {
          const a = h("a", "kefu-link", token);
          a.href = url.href;
          a.target = "_blank";
          a.rel = "noopener noreferrer nofollow";
          parent.appendChild(a);
        } else {
          parent.appendChild(document.createTextNode(token));
        }
        last = m.index + token.length;
        INLINE.lastIndex = last;
      } else {
        parent.appendChild(h("strong", null, m[2]));
        last = m.index + m[0].length;
      }
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  // storeLinksOnly: a bot answer, whose links are links only to the store's domains.
  function renderRich(container, text, storeLinksOnly) {
    container.replaceChildren();
    const lines = String(text).split(/\r\n|\r|\n/);
    let para = null; // current <p>
    let list = null; // current <ol>/<ul>
    let item = null; // current <li>
    let expected = 0; // next number in the current <ol>
    for (const line of lines) {
      const num = NUMBERED.exec(line);
      const bullet = num ? null : BULLET.exec(line);
      if (num) {
        const n = Number(num[1]);
        if (!list || list.tagName !== "OL" || n !== expected) {
          list = h("ol", "kefu-list");
          if (n !== 1) list.start = n;
          container.appendChild(list);
        }
        item = h("li");
        appendInline(item, num[2], storeLinksOnly);
        list.appendChild(item);
        expected = n + 1;
        para = null;
      } else if (bullet) {
        if (!list || list.tagName !== "UL") {
          list = h("ul", "kefu-list");
          container.appendChild(list);
        }
        item = h("li");
        appendInline(item, bullet[1], storeLinksOnly);
        list.appendChild(item);
        para = null;
      } else if (line.trim() === "") {
        // A blank line ends the paragraph; a list may continue after it ("1. a\n\n2. b").
        para = null;
        item = null;
      } else if (item && /^\s+\S/.test(line)) {
        // An indented line continues the list item above it.
        item.appendChild(h("br"));
        appendInline(item, line.trim(), storeLinksOnly);
      } else {
        list = null;
        item = null;
        if (!para) {
          para = h("p", "kefu-p");
          container.appendChild(para);
        } else {
          para.appendChild(h("br"));
        }
        appendInline(para, line, storeLinksOnly);
      }
    }
  }

  // ---------------------------------------------------------------------------------------------
  // State
  const stored = storage.get("conversation");
  const state = {
    open: false,
    activated: false, // a socket is wanted (opened once, a stored conversation, or an outbox)
    ws: null,
    ready: false, // the current socket got its `conversation` frame
    conn: "idle", // idle | connecting | online | reconnecting
    conversation: stored && stored.id ? String(stored.id) : null,
    token: stored && stored.token ? String(stored.token) : null,
    status: null, // bot | waiting_agent | agent | closed
    // What the server says about people (docs/protocol.md, availability): agents_online,
    // queue_position, expected_wait_s, contact_saved. The header, the notices and the e-mail
    // form all read it, so the widget never says two things at once.
    avail: null,
    contactPending: null, // the address sent in a `contact` frame, until contact.saved or an error
    agentName: null,
    attempts: 0,
    reconnectTimer: 0,
    forbiddenStreak: 0,
    lastTypingAt: 0,
    seenSeq: Number(storage.get("seen")) || 0,
    lastResyncAt: 0,
    // Older pages (docs/protocol.md, replay pages): the seq to ask `older` for next (null: none
    // older), whether an `older` is in flight, and the first seq of the last paged replay (the
    // messages below it are missing on purpose, not a gap).
    olderBefore: null,
    olderPending: false,
    replayFrom: null,
    replayRetryTimer: 0,
  };
  /** id -> record of a stored (or streaming) message. */
  const byId = new Map();
  /** client_id -> record of the shopper's own message not yet acknowledged. */
  const pending = new Map();
  /** client_ids sent on the current socket (so a flush does not send them twice). */
  const sentOnSocket = new Set();
  const seqs = new Set();
  let outbox = Array.isArray(storage.get("outbox")) ? storage.get("outbox") : [];
  outbox = outbox.filter((o) => o && typeof o.client_id === "string" && typeof o.text === "string");
  for (const o of outbox) if (!Array.isArray(o.attachments)) o.attachments = [];
  if (SIGNED_IN) {
    // Unsent messages of an earlier page were typed by whoever used this browser then: never
    // sent into the signed-in customer's conversation. Hers are kept in memory only.
    outbox = [];
    storage.remove("outbox");
  }

  function saveOutbox() {
    if (SIGNED_IN) return;
    if (outbox.length) storage.set("outbox", outbox);
    else storage.remove("outbox");
  }

  // ---------------------------------------------------------------------------------------------
  // DOM
  const host = document.createElement("kefu-chat");
  const shadow = host.attachShadow({ mode: "open" });

  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = CSS_URL;
  shadow.appendChild(link);

  const root = h("div", "kefu-root");
  root.lang = UI === "zh" ? "zh-CN" : "en";
  root.hidden = true; // until the stylesheet is in: no flash of unstyled widget
  root.dataset.conn = "idle";
  shadow.appendChild(root);
  const reveal = () => {
    root.hidden = false;
  };
  link.addEventListener("load", reveal);
  link.addEventListener("error", () => {
    console.error(`kefu: could not load ${CSS_URL}`);
    reveal();
  });
  setTimeout(reveal, 4000);

  // Launcher
  const launcher = h("button", "kefu-launcher");
  launcher.type = "button";
  launcher.setAttribute("aria-expanded", "false");
  launcher.setAttribute("aria-controls", "kefu-panel");
  launcher.appendChild(icon("chat"));
  launcher.appendChild(icon("minimize"));
  const badge = h("span", "kefu-badge");
  badge.setAttribute("aria-hidden", "true");
  badge.hidden = true;
  launcher.appendChild(badge);

  // Panel
  const panel = h("div", "kefu-panel");
  panel.id = "kefu-panel";
  panel.setAttribute("role", "dialog");
  panel.setAttribute("aria-modal", "false");
  panel.setAttribute("aria-labelledby", "kefu-title");
  panel.setAttribute("aria-describedby", "kefu-subtitle");
  panel.hidden = true;

  const header = h("div", "kefu-header");
  const avatar = h("span", "kefu-avatar");
  avatar.setAttribute("aria-hidden", "true");
  avatar.appendChild(icon("chat"));
  const heading = h("div", "kefu-heading");
  const title = h("h2", "kefu-title", TITLE);
  title.id = "kefu-title";
  const subtitle = h("p", "kefu-subtitle");
  subtitle.id = "kefu-subtitle";
  const connDot = h("span", "kefu-dot");
  connDot.setAttribute("aria-hidden", "true");
  const subtitleText = h("span", null, T.subtitleIdle);
  subtitle.append(connDot, subtitleText);
  heading.append(title, subtitle);
  const closeBtn = h("button", "kefu-iconbtn kefu-close");
  closeBtn.type = "button";
  closeBtn.setAttribute("aria-label", T.closeChat);
  closeBtn.title = T.closeChat;
  closeBtn.appendChild(icon("close"));
  // "Talk to a person": the `ask_person` frame hands the conversation to the agents' queue at
  // once (docs/protocol.md 4.3). Shown while the bot answers; hidden once a person is asked for.
  const personBtn = h("button", "kefu-person", T.askPerson);
  personBtn.type = "button";
  personBtn.hidden = true;
  header.append(avatar, heading, personBtn, closeBtn);

  const log = h("div", "kefu-log");
  log.setAttribute("role", "log");
  log.setAttribute("aria-live", "polite");
  log.setAttribute("aria-relevant", "additions");
  log.setAttribute("aria-label", T.log);
  log.tabIndex = 0; // a scrollable region must be reachable with the keyboard

  // "Load earlier messages": shown when a replay left older messages on the server (replay.more);
  // it asks for the page before the oldest message held (`older`). First in the log: rows are
  // ordered among themselves below it.
  const earlier = h("button", "kefu-linkbtn kefu-earlier", T.loadEarlier);
  earlier.type = "button";
  earlier.hidden = true;
  log.appendChild(earlier);

  const welcome = h("div", "kefu-welcome");
  welcome.append(h("p", "kefu-welcome__title", T.welcomeTitle), h("p", "kefu-welcome__text", T.welcomeText));
  log.appendChild(welcome);

  const thinking = h("div", "kefu-thinking");
  thinking.setAttribute("aria-hidden", "true");
  thinking.hidden = true;
  const dots = h("span", "kefu-dots");
  dots.append(h("span"), h("span"), h("span"));
  const thinkingLabel = h("span", "kefu-label", T.bot);
  thinking.append(thinkingLabel, dots);

  // Announces a finished streamed answer once (the streaming bubble itself is hidden from the
  // live log while it grows, so screen readers do not read every delta).
  const announcer = h("div", "kefu-sr");
  announcer.setAttribute("role", "status");
  announcer.setAttribute("aria-live", "polite");
  announcer.setAttribute("aria-atomic", "true");

  const footer = h("div", "kefu-footer");
  const form = h("form", "kefu-form");
  form.noValidate = true;
  const inputLabel = h("label", "kefu-sr", T.inputLabel);
  inputLabel.htmlFor = "kefu-input";
  const input = h("textarea", "kefu-input");
  input.id = "kefu-input";
  input.rows = 1;
  input.placeholder = T.placeholder;
  input.setAttribute("aria-describedby", "kefu-hint kefu-counter kefu-error");
  input.autocomplete = "off";
  input.setAttribute("enterkeyhint", "send");
  const sendBtn = h("button", "kefu-send");
  sendBtn.type = "submit";
  sendBtn.setAttribute("aria-label", T.send);
  sendBtn.title = T.send;
  sendBtn.disabled = true;
  sendBtn.appendChild(icon("send"));
  // Attachments (docs/widget.md, "Photos"): the picker, drag and drop on the panel, or paste.
  const attachBtn = h("button", "kefu-iconbtn kefu-attach");
  attachBtn.type = "button";
  attachBtn.setAttribute("aria-label", T.attach);
  attachBtn.title = T.attach;
  attachBtn.appendChild(icon("clip"));
  const fileInput = h("input", "kefu-file");
  fileInput.type = "file";
  fileInput.accept = "image/jpeg,image/png,image/webp,image/gif,image/heic,image/heif,.heic,.heif,application/pdf";
  fileInput.hidden = true;
  form.append(attachBtn, fileInput, inputLabel, input, sendBtn);
  const below = h("div", "kefu-below");
  const error = h("p", "kefu-error");
  error.id = "kefu-error";
  error.setAttribute("role", "alert");
  const hint = h("p", "kefu-hint", T.hint);
  hint.id = "kefu-hint";
  const counter = h("p", "kefu-counter");
  counter.id = "kefu-counter";
  counter.hidden = true;
  const progress = h("progress", "kefu-progress");
  progress.max = 100;
  progress.value = 0;
  progress.hidden = true;
  below.append(progress, error, hint, counter);
  // The e-mail form, offered while the shopper waits and no one from the team is online.
  // An e-mail form (this one, and the transcript's after a conversation closes): its box, hidden,
  // with a prompt, a labelled e-mail input, a submit button and an error line, all named `kefu-NAME…`.
  function emailForm(name, prompt, save) {
    const box = h("div", `kefu-${name}`);
    box.hidden = true;
    const text = h("p", `kefu-${name}__text`, prompt);
    text.id = `kefu-${name}-text`;
    const form = h("form", `kefu-${name}__form`);
    form.noValidate = true;
    const label = h("label", "kefu-sr", T.contactLabel);
    label.htmlFor = `kefu-${name}-email`;
    const input = h("input", `kefu-${name}__input`);
    input.id = `kefu-${name}-email`;
    input.type = "email";
    input.autocomplete = "email";
    input.maxLength = 254;
    input.placeholder = "name@example.com";
    input.setAttribute("aria-describedby", `kefu-${name}-text kefu-${name}-error`);
    const btn = h("button", `kefu-${name}__save`, save);
    btn.type = "submit";
    const error = h("p", `kefu-${name}__error`);
    error.id = `kefu-${name}-error`;
    error.setAttribute("role", "alert");
    form.append(label, input, btn);
    box.append(text, form, error);
    return { box, text, form, input, btn, error };
  }
  const {
    box: contactBox,
    form: contactForm,
    input: contactInput,
    btn: contactBtn,
    error: contactError,
  } = emailForm("contact", T.contactPrompt, T.contactSave);
  footer.append(contactBox, form, below);

  panel.append(header, log, footer, announcer);
  root.append(panel, launcher);

  // ---------------------------------------------------------------------------------------------
  // Rendering messages
  function labelFor(rec) {
    if (rec.role === "shopper") return T.you;
    if (rec.role === "agent") return rec.agent || T.agent;
    if (rec.role === "system") return T.system;
    return T.bot;
  }

  function buildRow(rec) {
    const row = h("div", `kefu-msg kefu-msg--${rec.role}`);
    if (rec.role === "system") {
      row.appendChild(h("span", "kefu-sr", T.said(T.system, "")));
      rec.bubble = h("div", "kefu-system-text");
      row.appendChild(rec.bubble);
    } else {
      const label = h("div", "kefu-label");
      label.appendChild(document.createTextNode(labelFor(rec)));
      if (rec.role === "agent") {
        label.appendChild(document.createTextNode(" "));
        label.appendChild(h("span", "kefu-tag", T.staff));
      }
      label.appendChild(h("span", "kefu-sr", UI === "zh" ? "：" : ":"));
      rec.bubble = h("div", "kefu-bubble");
      rec.meta = h("div", "kefu-meta");
      row.append(label, rec.bubble, rec.meta);
    }
    rec.el = row;
    return row;
  }

  /** Thumbnails (images) and links (PDFs) of a message's files; links open in a new tab. */
  function renderAttachments(rec) {
    if (!rec.attachments || !rec.attachments.length) return;
    const box = h("div", "kefu-files");
    for (const a of rec.attachments) {
      if (!a || typeof a.url !== "string") continue;
      const href = new URL(a.url, SERVER.origin).href;
      const name = String(a.name || "");
      const link = h("a", "kefu-file-link");
      link.href = href;
      link.target = "_blank";
      link.rel = "noopener noreferrer";
      link.title = T.attachOpen(name);
      if (String(a.content_type || "").startsWith("image/")) {
        const img = h("img", "kefu-thumb");
        img.src = href;
        img.alt = T.attachAlt(name);
        img.loading = "lazy";
        link.appendChild(img);
      } else {
        link.appendChild(icon("clip"));
        link.appendChild(document.createTextNode(name));
      }
      box.appendChild(link);
    }
    rec.bubble.appendChild(box);
  }

  // Product cards (docs/protocol.md, "Product cards"): every field set as text, never markup; a
  // link or an image only over http(s) (a path resolves against the page) on the store's domains
  // (`link_domains`), an image also on `image_hosts`; any other address is left out.
  let imageHosts = [];

  function cardAddress(value, hosts) {
    if (typeof value !== "string" || !value) return null;
    let url = null;
    try {
      url = new URL(value, document.baseURI);
    } catch (_) {
      return null;
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") return null;
    const host = url.hostname.toLowerCase().replace(/\.$/, "");
    const own = value.startsWith("/") && !value.startsWith("//") && url.origin === location.origin;
    return own || hosts.some((d) => host === d || host.endsWith(`.${d}`)) ? url.href : null;
  }

  function renderCards(rec) {
    if (!Array.isArray(rec.cards) || !rec.cards.length) return;
    const box = h("div", "kefu-cards");
    for (const c of rec.cards.slice(0, 3)) {
      if (!c || typeof c !== "object") continue;
      const card = h("div", "kefu-card");
      card.dataset.sku = String(c.sku || "");
      const src = cardAddress(c.image, linkDomains.concat(imageHosts));
      if (src) {
        const img = h("img", "kefu-card-img");
        img.src = src;
        img.alt = String(c.title || "");
        img.loading = "lazy";
        img.referrerPolicy = "no-referrer";
        card.appendChild(img);
      }
      const body = h("div", "kefu-card-body");
      body.appendChild(h("div", "kefu-card-title", String(c.title || "")));
      if (c.price_text) body.appendChild(h("div", "kefu-card-price", String(c.price_text)));
      if (typeof c.stock === "number") {
        const inStock = c.stock > 0;
        const st = h("div", `kefu-card-stock${inStock ? "" : " is-out"}`, inStock ? T.cardInStock(c.stock) : T.cardOutOfStock);
        body.appendChild(st);
      }
      if (typeof c.description === "string" && c.description) body.appendChild(h("p", "kefu-card-desc", c.description));
      if (Array.isArray(c.facts) && c.facts.length) {
        const dl = h("dl", "kefu-card-facts");
        for (const f of c.facts) {
          if (!Array.isArray(f) || f.length < 2) continue;
          dl.append(h("dt", null, String(f[0])), h("dd", null, String(f[1])));
        }
        body.appendChild(dl);
      }
      const href = cardAddress(c.url, linkDomains);
      if (href) {
        const a = h("a", "kefu-card-link", T.cardView);
        a.href = href;
        a.target = "_blank";
        a.rel = "noopener noreferrer nofollow";
        body.appendChild(a);
      }
      card.appendChild(body);
      box.appendChild(card);
    }
    rec.bubble.appendChild(box);
  }

  function paint(rec) {
    renderRich(rec.bubble, rec.text, rec.role === "bot");
    renderAttachments(rec);
    renderCards(rec);
    rec.el.classList.toggle("is-pending", !!rec.pendingSend);
    rec.el.classList.toggle("is-failed", !!rec.failed);
    rec.el.classList.toggle("is-streaming", !!rec.streaming);
    rec.el.classList.toggle("is-cut", !!rec.cut);
    // An answer dropped before any text because the shopper went on typing (burst debounce): its
    // seq is held (seqs stay dense), nothing is shown; the next answer replies to every fragment.
    rec.el.hidden = !!rec.superseded;
    if (rec.streaming) {
      rec.el.setAttribute("aria-hidden", "true");
      rec.el.setAttribute("aria-busy", "true");
    } else {
      rec.el.removeAttribute("aria-hidden");
      rec.el.removeAttribute("aria-busy");
    }
    if (rec.id != null) rec.el.dataset.id = String(rec.id);
    if (rec.seq != null) rec.el.dataset.seq = String(rec.seq);
    if (rec.client_id) rec.el.dataset.clientId = rec.client_id;
    paintMeta(rec);
  }

  function paintMeta(rec) {
    if (!rec.meta) return;
    rec.meta.replaceChildren();
    if (rec.pendingSend) rec.meta.appendChild(h("span", "kefu-state", T.sending));
    if (rec.failed) {
      rec.meta.appendChild(h("span", "kefu-state kefu-state--failed", T.notSent));
      if (rec.retryable) {
        const retry = h("button", "kefu-linkbtn", T.retry);
        retry.type = "button";
        retry.addEventListener("click", () => resend(rec));
        rec.meta.appendChild(retry);
      }
    }
    if (rec.cut) rec.meta.appendChild(h("span", "kefu-state kefu-state--cut", T.interrupted));
    if (rec.role === "bot" && !rec.streaming && rec.id != null && isAnswer(rec)) {
      const group = h("span", "kefu-feedback");
      group.setAttribute("role", "group");
      group.setAttribute("aria-label", T.feedback);
      for (const [rating, name, label] of [
        ["up", "up", T.helpful],
        ["down", "down", T.notHelpful],
      ]) {
        const b = h("button", `kefu-iconbtn kefu-rate kefu-rate--${rating}`);
        b.type = "button";
        b.setAttribute("aria-label", label);
        b.title = label;
        b.setAttribute("aria-pressed", String(rec.rating === rating));
        b.appendChild(icon(name));
        b.addEventListener("click", () => rate(rec, rating));
        group.appendChild(b);
      }
      const thanks = h("span", "kefu-thanks", rec.rating ? T.thanks : "");
      group.appendChild(thanks);
      rec.meta.appendChild(group);
    }
    rec.meta.hidden = !rec.meta.firstChild;
  }

  /** The highest seq shown so far. */
  function maxSeq() {
    let max = 0;
    for (const s of seqs) if (s > max) max = s;
    return max;
  }

  // Rows are kept in seq order. Each row and notice has a data-order: its seq; for a notice or a
  // refused message, just after the newest message at the time; for the shopper's unacknowledged
  // messages, Infinity (they stay last until their seq arrives).
  function insertOrdered(el, order) {
    el.dataset.order = String(order);
    let before = null;
    for (const other of log.children) {
      if (other === el || other.dataset.order == null) continue;
      if (Number(other.dataset.order) > order) {
        before = other;
        break;
      }
    }
    if (!before) before = thinking.parentNode === log ? thinking : null;
    log.insertBefore(el, before);
    welcome.hidden = true;
  }

  function place(rec) {
    const stick = nearBottom() || rec.role === "shopper";
    let order = rec.seq;
    if (order == null) order = rec.failed ? rec.failedAfter : Infinity;
    insertOrdered(rec.el, order);
    if (stick) scrollToEnd();
  }

  // Follow new content only while the shopper is at the bottom: reading older messages is not
  // interrupted by a growing answer. Updated from scroll events, not measured as content grows.
  let pinned = true;
  log.addEventListener("scroll", () => {
    pinned = log.scrollHeight - log.scrollTop - log.clientHeight < 80;
  }, { passive: true });
  function nearBottom() {
    return pinned;
  }
  function scrollToEnd() {
    pinned = true;
    requestAnimationFrame(() => {
      log.scrollTop = log.scrollHeight;
    });
  }

  /** Customer satisfaction, asked once the conversation closes: five buttons (1-5), one click
   * sends {"type": "csat", "score"}; the server's csat.saved thanks the shopper. */
  function askCsat() {
    const old = log.querySelector(".kefu-csat");
    if (old) old.remove();
    const box = h("div", "kefu-notice kefu-csat");
    box.setAttribute("role", "group");
    box.setAttribute("aria-label", T.csatAsk);
    box.appendChild(h("span", "kefu-csat__ask", T.csatAsk));
    const row = h("span", "kefu-csat__scores");
    for (let n = 1; n <= 5; n++) {
      const b = h("button", "kefu-csat__score", String(n));
      b.type = "button";
      b.title = T.csatScore(n);
      b.setAttribute("aria-label", `${n}: ${T.csatScore(n)}`);
      b.addEventListener("click", () => {
        if (!send({ type: "csat", score: n })) return;
        for (const other of row.querySelectorAll("button")) other.setAttribute("aria-pressed", String(other === b));
      });
      row.appendChild(b);
    }
    box.appendChild(row);
    const stick = nearBottom();
    insertOrdered(box, maxSeq() + 0.6);
    if (stick) scrollToEnd();
  }

  function onCsatSaved() {
    const box = log.querySelector(".kefu-csat");
    if (box) box.replaceChildren(h("span", "kefu-csat__ask", T.csatThanks));
    announce(T.csatThanks);
  }

  function addNotice(text) {
    const stick = nearBottom();
    insertOrdered(h("div", "kefu-notice", text), maxSeq() + 0.5);
    if (stick) scrollToEnd();
  }

  function announce(text) {
    announcer.textContent = "";
    setTimeout(() => {
      announcer.textContent = text;
    }, 50);
  }

  // One indicator at the end of the log: the bot preparing an answer, or the agent who holds the
  // conversation typing (the server relays an agent's typing at most every 2 s while they type).
  let thinkingTimer = 0;
  function showIndicator(label, who, timeoutMs) {
    const stick = nearBottom();
    thinkingLabel.textContent = label;
    thinking.dataset.who = who;
    log.appendChild(thinking);
    thinking.hidden = false;
    clearTimeout(thinkingTimer);
    thinkingTimer = setTimeout(hideThinking, timeoutMs);
    if (stick) scrollToEnd();
  }
  function showThinking() {
    if (state.status && state.status !== "bot") return;
    showIndicator(T.bot, "bot", THINKING_TIMEOUT_MS);
  }
  function showAgentTyping(f) {
    if (state.status !== "agent" || f.role !== "agent") return;
    showIndicator(typeof f.agent === "string" && f.agent ? f.agent : state.agentName || T.agent, "agent", AGENT_TYPING_MS);
  }
  function hideThinking() {
    clearTimeout(thinkingTimer);
    thinking.hidden = true;
  }

  const repaintQueue = new Set();
  let repaintScheduled = false;
  function repaintSoon(rec) {
    repaintQueue.add(rec);
    if (repaintScheduled) return;
    repaintScheduled = true;
    requestAnimationFrame(() => {
      repaintScheduled = false;
      const stick = nearBottom();
      for (const r of repaintQueue) paint(r);
      repaintQueue.clear();
      if (stick) scrollToEnd();
    });
  }

  function noteSeq(rec) {
    if (rec.seq != null) seqs.add(rec.seq);
    updateUnread();
  }

  /** The `after` of a resume: the highest seq held complete, below any answer still streaming. */
  function afterSeq() {
    let after = 0;
    let streamingFloor = Infinity;
    for (const rec of byId.values()) {
      if (rec.seq == null) continue;
      if (rec.streaming) streamingFloor = Math.min(streamingFloor, rec.seq - 1);
      else after = Math.max(after, rec.seq);
    }
    return Math.max(0, Math.min(after, streamingFloor));
  }

  function messageCount() {
    return byId.size + pending.size;
  }

  function clearConversationView() {
    for (const rec of byId.values()) rec.el.remove();
    byId.clear();
    seqs.clear();
    for (const el of Array.from(log.querySelectorAll(".kefu-notice"))) el.remove();
    hideThinking();
    state.status = null;
    state.agentName = null;
    state.seenSeq = 0;
    storage.remove("seen");
    state.olderBefore = null;
    state.olderPending = false;
    state.replayFrom = null;
    updateEarlier();
    welcome.hidden = pending.size > 0;
    updateUnread();
  }

  // ---------------------------------------------------------------------------------------------
  // Unread badge: bot/agent/system messages with a seq above the last one seen with the panel open.
  function updateUnread() {
    if (state.open) {
      let max = state.seenSeq;
      for (const s of seqs) if (s > max) max = s;
      if (max !== state.seenSeq) {
        state.seenSeq = max;
        storage.set("seen", max);
      }
    }
    let unread = 0;
    if (!state.open) {
      for (const rec of byId.values()) {
        if (rec.role !== "shopper" && rec.seq != null && rec.seq > state.seenSeq && !rec.streaming) unread++;
      }
    }
    badge.hidden = unread === 0;
    badge.textContent = unread > 9 ? "9+" : String(unread);
    const base = state.open ? T.closeChat : T.openChat;
    launcher.setAttribute("aria-label", unread ? `${base} (${T.unread(unread)})` : base);
  }

  // ---------------------------------------------------------------------------------------------
  // Header: conversation status and connection state
  function waitText(a) {
    if (a && typeof a.expected_wait_s === "number") return T.minutes(a.expected_wait_s);
    return a && a.agents_online > 0 ? AWAY_T.waitUnknown : "";
  }

  // Opening hours and an unknown wait (docs/widget.md, availability `open` / `opens_at`): outside
  // the store's hours with nobody online, the header says when the team is back, in the
  // shopper's own time zone and language, and the e-mail form is offered.
  const AWAY_T = {
    en: {
      closedUntil: (when) => `We're closed · back ${when}`,
      closed: "We're closed right now",
      waitUnknown: "we'll reply here or by e-mail",
    },
    zh: {
      closedUntil: (when) => `当前非营业时间 · ${when} 回来`,
      closed: "当前非营业时间",
      waitUnknown: "我们会在这里或通过邮件回复您",
    },
  }[UI];

  function awayNow(a) {
    return !!a && a.open === false && a.agents_online === 0;
  }

  function backText(iso) {
    const when = new Date(iso);
    if (Number.isNaN(when.getTime())) return "";
    try {
      return new Intl.DateTimeFormat(UI === "zh" ? "zh-CN" : "en", {
        weekday: "short",
        month: "short",
        day: "numeric",
        hour: "2-digit",
        minute: "2-digit",
      }).format(when);
    } catch (_) {
      return when.toLocaleString();
    }
  }

  function hoursSubtitle(a) {
    if (!awayNow(a) || state.status === "agent" || state.status === "closed" || state.conn !== "online") return "";
    const when = typeof a.opens_at === "string" ? backText(a.opens_at) : "";
    return when ? AWAY_T.closedUntil(when) : AWAY_T.closed;
  }

  function offerEmailAway(a) {
    return awayNow(a) && !a.contact_saved && state.status !== "agent" && state.status !== "closed";
  }

  function updateHeader() {
    const a = state.avail;
    root.dataset.conn = state.conn;
    root.dataset.status = state.status || "none";
    personBtn.hidden = state.conn !== "online" || !(state.status === "bot" || state.status === null);
    // The dot is the team's availability once connected (green: someone online), the
    // connection's state otherwise (amber, pulsing).
    root.dataset.team = a ? (a.agents_online > 0 ? "online" : "offline") : "unknown";
    connDot.title = a ? (a.agents_online > 0 ? T.teamOnline(a.agents_online) : T.teamOffline) : "";
    let text;
    if (state.conn === "reconnecting") text = T.reconnecting;
    else if (state.conn === "connecting" && !state.conversation) text = T.connecting;
    else if (state.status === "waiting_agent" && a && a.agents_online === 0) text = T.subtitleNoOne;
    else if (state.status === "waiting_agent" && a && a.queue_position) text = T.subtitleQueue(a.queue_position, waitText(a));
    else if (state.status === "waiting_agent") text = T.subtitleWaiting;
    else if (state.status === "agent") text = T.subtitleAgent(state.agentName || T.agent);
    else if (state.status === "closed") text = T.subtitleClosed;
    else if (state.status === "bot") text = T.subtitleBot;
    else text = T.subtitleIdle;
    subtitleText.textContent = hoursSubtitle(a) || text;
    updateContact();
    updateTranscript();
  }

  function updateContact() {
    const a = state.avail;
    const offer =
      (state.status === "waiting_agent" && !!a && a.agents_online === 0 && !a.contact_saved) || offerEmailAway(a);
    contactBox.hidden = !offer;
    contactBtn.disabled = state.contactPending !== null || !state.ready;
  }

  function setAvailability(a) {
    if (!a || typeof a !== "object" || typeof a.agents_online !== "number") return;
    state.avail = {
      agents_online: a.agents_online,
      queue_position: typeof a.queue_position === "number" ? a.queue_position : null,
      expected_wait_s: typeof a.expected_wait_s === "number" ? a.expected_wait_s : null,
      contact_saved: !!a.contact_saved,
      open: typeof a.open === "boolean" ? a.open : null,
      opens_at: typeof a.opens_at === "string" ? a.opens_at : null,
    };
    updateHeader();
  }

  function onAvailability(f) {
    setAvailability(f);
  }

  function submitContact(e) {
    e.preventDefault();
    const email = contactInput.value.trim();
    if (!email || !contactInput.checkValidity()) {
      contactError.textContent = T.contactInvalid;
      return;
    }
    if (!state.ready || !state.ws) return;
    contactError.textContent = "";
    state.contactPending = email;
    send({ type: "contact", email });
    updateContact();
  }
  contactForm.addEventListener("submit", submitContact);

  function onContactSaved(f) {
    state.contactPending = null;
    contactInput.value = "";
    if (state.avail) state.avail.contact_saved = true;
    addNotice(T.contactSaved(String(f.email || "")));
    updateHeader();
  }

  function setConn(conn) {
    state.conn = conn;
    updateHeader();
  }

  function setStatus(status, agent, withNotice) {
    const prev = state.status;
    const prevAgent = state.agentName;
    state.status = status;
    if (agent) state.agentName = agent;
    if (withNotice && prev !== null) {
      // Someone online: where the shopper stands. No one: the server's stored notice says so and
      // the e-mail form is offered (updateContact); a widget line would only repeat it.
      if (status === "waiting_agent" && prev !== "waiting_agent") {
        const a = state.avail;
        if (a && a.agents_online > 0 && a.queue_position) addNotice(T.noticeWaiting(a.queue_position, waitText(a)));
      }
      else if (status === "agent" && (prev !== "agent" || (agent && agent !== prevAgent)))
        addNotice(agent ? T.noticeAgent(agent) : T.noticeAgentAnon);
      else if (status === "closed" && prev !== "closed") {
        addNotice(T.noticeClosed);
        askCsat();
      }
      else if (status === "bot" && (prev === "agent" || prev === "waiting_agent")) addNotice(T.noticeBot);
    }
    if (status !== "bot") hideThinking();
    updateHeader();
  }

  // ---------------------------------------------------------------------------------------------
  // Errors shown near the input
  let errorTimer = 0;
  function showError(text) {
    clearTimeout(errorTimer);
    error.textContent = text;
    root.classList.add("has-error");
    errorTimer = setTimeout(clearError, ERROR_VISIBLE_MS);
  }
  function clearError() {
    clearTimeout(errorTimer);
    error.textContent = "";
    root.classList.remove("has-error");
  }
  /** A ``notice`` frame's text: our own wording for known codes, else the server's (localized there). */
  function noticeText(frame) {
    const known = T.notices && T.notices[frame.code];
    return known || String(frame.message || "");
  }
  /** Known codes get our own (localized, shopper-friendly) wording; others the server's. */
  function errorText(frame) {
    const known = T.errors[frame.code];
    if (known) return known;
    if (UI === "en" && typeof frame.message === "string" && frame.message.trim()) return frame.message;
    return T.errors.generic;
  }

  // ---------------------------------------------------------------------------------------------
  // Socket
  function send(frame) {
    if (!state.ws || state.ws.readyState !== WebSocket.OPEN) return false;
    try {
      state.ws.send(JSON.stringify(frame));
      return true;
    } catch (_) {
      return false;
    }
  }

  function connect() {
    state.activated = true;
    clearTimeout(state.reconnectTimer);
    state.reconnectTimer = 0;
    if (state.ws) return;
    let ws;
    try {
      ws = new WebSocket(WS_URL);
    } catch (err) {
      console.error("kefu: cannot open the chat socket", err);
      scheduleReconnect();
      return;
    }
    state.ws = ws;
    state.ready = false;
    sentOnSocket.clear();
    setConn(state.attempts > 0 ? "reconnecting" : "connecting");

    ws.addEventListener("open", () => {
      if (ws !== state.ws) return;
      const hello = { type: "hello", locale: LOCALE };
      // The shopper's time zone (IANA name) names an anonymous visitor in the agents' inbox.
      try {
        const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
        if (zone) hello.time_zone = zone;
      } catch (e) {
        // an old browser without Intl time zones: the inbox shows the language only
      }
      if (state.conversation && state.token) {
        hello.conversation = state.conversation;
        hello.token = state.token;
        hello.after = afterSeq();
      }
      if (identityToken) {
        hello.identity = identityToken;
        identityToken = null; // a token is good for one hello (the server refuses a replay)
      }
      send(hello);
    });
    ws.addEventListener("message", (event) => {
      if (ws !== state.ws) return;
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch (_) {
        return;
      }
      if (frame && typeof frame === "object") handleFrame(frame);
    });
    ws.addEventListener("close", (event) => {
      if (ws !== state.ws) return;
      state.ws = null;
      state.ready = false;
      if (state.olderPending) {
        state.olderPending = false; // its page was lost with the socket: the control asks again
        updateEarlier();
      }
      sentOnSocket.clear();
      hideThinking();
      for (const rec of byId.values()) {
        if (rec.streaming) rec.el.classList.add("is-stalled");
      }
      if (event.code === 4401) {
        // The store's identity token was refused (the error frame before said why): go on as an
        // anonymous shopper; the store's developer sees the reason in the console.
        console.warn("kefu: the identity token was refused; chatting anonymously");
      }
      if (event.code === 4403) {
        // Bad or expired token, or an unknown conversation: forget it and start a new one.
        forgetConversation();
        state.forbiddenStreak++;
        if (state.forbiddenStreak === 1) {
          const hadMessages = byId.size > 0;
          clearConversationView();
          if (hadMessages) addNotice(T.noticeNew);
          setConn("connecting");
          state.reconnectTimer = setTimeout(connect, 0);
          return;
        }
      }
      scheduleReconnect();
    });
  }

  function scheduleReconnect() {
    if (!state.activated) return;
    clearTimeout(state.reconnectTimer);
    const ceiling = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** state.attempts);
    const delay = ceiling / 2 + Math.random() * (ceiling / 2); // "equal jitter"
    state.attempts = Math.min(state.attempts + 1, 30);
    setConn("reconnecting");
    state.reconnectTimer = setTimeout(connect, delay);
  }

  function reconnectNow() {
    if (state.activated && !state.ws) connect();
  }
  window.addEventListener("online", reconnectNow);
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") reconnectNow();
  });

  function forgetConversation() {
    state.conversation = null;
    state.token = null;
    storage.remove("conversation");
  }

  // ---------------------------------------------------------------------------------------------
  // Frames from the server
  // ---------------------------------------------------------------------------------------------
  // Gaps: a frame the server sent may not arrive (docs/protocol.md, resync). Seqs are dense per
  // conversation, and a stream's deltas carry `pos` (code points before them): a seq or a pos
  // that skips ahead, or a stream silent for STALL_MS, means something was missed, and a
  // `resync` asks for every stored message after the last seq held complete.
  const STALL_MS = 20000;
  const RESYNC_EVERY_MS = 2000;

  function requestResync() {
    if (!state.ready) return;
    const now = Date.now();
    if (now - state.lastResyncAt < RESYNC_EVERY_MS) return;
    if (send({ type: "resync", after: afterSeq() })) state.lastResyncAt = now;
  }

  function checkSeqGap(f) {
    if (typeof f.seq !== "number" || !seqs.size || seqs.has(f.seq)) return;
    if (f.seq === state.replayFrom) return; // the first of a paged replay: older ones are asked for
    if (f.seq > maxSeq() + 1) requestResync();
  }

  setInterval(() => {
    const now = Date.now();
    for (const rec of byId.values()) {
      if (rec.streaming && now - (rec.lastFrameAt || now) > STALL_MS) {
        rec.lastFrameAt = now; // one request per stall
        requestResync();
      }
    }
  }, 5000);

  function handleFrame(f) {
    if (f.type === "message" || f.type === "stream.start" || f.type === "stream.end") checkSeqGap(f);
    switch (f.type) {
      case "conversation":
        return onConversation(f);
      case "message":
        return onMessage(f);
      case "stream.start":
        return onStreamStart(f);
      case "stream.delta":
        return onStreamDelta(f);
      case "stream.end":
        return onStreamEnd(f);
      case "availability":
        return onAvailability(f);
      case "contact.saved":
        return onContactSaved(f);
      case "csat.saved":
        return onCsatSaved();
      case "status":
        setAvailability(f.availability); // first: the notice the status change adds reads it
        return setStatus(String(f.status), typeof f.agent === "string" ? f.agent : null, true);
      case "error":
        return onError(f);
      case "typing":
        return showAgentTyping(f);
      case "notice":
        return addNotice(noticeText(f));
      case "replay.more":
        return onReplayMore(f);
      case "older.end":
        return onOlderEnd(f);
      default:
        return undefined; // unknown frames are ignored (forward compatible)
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Older pages: a replay sends the newest page only (docs/protocol.md, replay pages).
  function minSeq() {
    let min = Infinity;
    for (const s of seqs) if (s < min) min = s;
    return min;
  }

  function updateEarlier() {
    earlier.hidden = state.olderBefore == null;
    earlier.disabled = state.olderPending;
    earlier.textContent = state.olderPending ? T.loadingEarlier : T.loadEarlier;
  }

  function askOlder() {
    if (state.olderBefore == null || state.olderPending || !state.ready) return;
    if (send({ type: "older", before: state.olderBefore })) {
      state.olderPending = true;
      updateEarlier();
    }
  }
  earlier.addEventListener("click", askOlder);

  function onReplayMore(f) {
    if (typeof f.before !== "number") return;
    state.replayFrom = f.before;
    state.olderBefore = state.olderBefore == null ? f.before : Math.min(state.olderBefore, f.before);
    updateEarlier();
  }

  function onOlderEnd(f) {
    state.olderPending = false;
    const held = minSeq();
    state.olderBefore = f.more && Number.isFinite(held) ? held : null;
    updateEarlier();
  }

  /** A replay or an older page went over the replay budget: ask again after `retry_after` s. */
  function onReplayLimited(f) {
    const wait = Math.max(1, Number(f.retry_after) || 1) * 1000;
    clearTimeout(state.replayRetryTimer);
    state.replayRetryTimer = setTimeout(() => {
      if (!state.ready) return; // a reconnect replays anyway
      if (state.olderPending) {
        state.olderPending = false;
        askOlder();
      } else {
        state.lastResyncAt = 0;
        requestResync();
      }
    }, wait);
  }

  function onConversation(f) {
    if (f.protocol != null && f.protocol !== 1) console.warn(`kefu: server speaks protocol ${f.protocol}, widget speaks 1`);
    const id = String(f.id);
    if (state.conversation && state.conversation !== id) clearConversationView();
    if (!state.conversation && byId.size) clearConversationView();
    state.conversation = id;
    state.token = String(f.token);
    if (Array.isArray(f.link_domains)) linkDomains = f.link_domains.map((d) => String(d).toLowerCase());
    if (Array.isArray(f.image_hosts)) imageHosts = f.image_hosts.map((d) => String(d).toLowerCase());
    // A signed-in customer's conversation is not kept in the browser: after they sign out, the
    // next person at this device must not resume it (a page of theirs signs them in again).
    if (f.customer) storage.remove("conversation");
    else storage.set("conversation", { id: state.conversation, token: state.token });
    state.ready = true;
    state.attempts = 0;
    state.forbiddenStreak = 0;
    state.contactPending = null;
    setAvailability(f.availability);
    setStatus(typeof f.status === "string" ? f.status : "bot", null, false);
    setConn("online");
    flushOutbox();
    pumpUploads(); // files picked before the conversation was known
  }

  function newRecord(fields) {
    const rec = Object.assign(
      { id: null, seq: null, role: "bot", text: "", cp: 0, streaming: false, endedByStream: false, cut: false },
      fields,
    );
    buildRow(rec);
    return rec;
  }

  function onMessage(f) {
    const role = ["shopper", "bot", "agent", "system"].includes(f.role) ? f.role : "system";
    const text = typeof f.text === "string" ? f.text : "";
    const seq = typeof f.seq === "number" ? f.seq : null;

    // The acknowledgement of one of our own messages.
    if (role === "shopper" && f.client_id && pending.has(f.client_id)) {
      const rec = pending.get(f.client_id);
      pending.delete(f.client_id);
      dropFromOutbox(f.client_id);
      if (byId.has(f.id)) {
        rec.el.remove(); // already shown (a replay got here first)
      } else {
        rec.id = f.id;
        rec.seq = seq;
        rec.text = text || rec.text;
        if (Array.isArray(f.attachments)) rec.attachments = f.attachments;
        rec.pendingSend = false;
        rec.failed = false;
        byId.set(rec.id, rec);
        paint(rec);
        place(rec);
        noteSeq(rec);
      }
      if (state.status === "bot" || state.status === null) showThinking();
      return;
    }

    const known = byId.get(f.id);
    if (known) {
      // A replay of a message we hold. A stored copy of a streaming answer ends the stream;
      // after a stream.end the stream's text is authoritative.
      if (known.streaming || (!known.endedByStream && known.text !== text)) {
        known.streaming = false;
        known.text = text;
        if (Array.isArray(f.cards)) known.cards = f.cards;
        if (f.cut) known.cut = true;
        repaintSoon(known);
      }
      return;
    }
    if (seq != null && seqs.has(seq)) return;

    const rec = newRecord({
      id: f.id,
      seq,
      role,
      text,
      cut: !!f.cut,
      superseded: !!f.superseded,
      route: f.route,
      agent: f.agent || null,
      attachments: Array.isArray(f.attachments) ? f.attachments : [],
      cards: Array.isArray(f.cards) ? f.cards : [],
    });
    if (role === "agent" && f.agent) state.agentName = state.agentName || f.agent;
    byId.set(rec.id, rec);
    paint(rec);
    place(rec);
    noteSeq(rec);
    if (role !== "shopper") hideThinking();
  }

  function onStreamStart(f) {
    let rec = byId.get(f.id);
    if (rec) {
      if (rec.endedByStream) return; // already complete: ignore a duplicate stream
      rec.text = ""; // a resume (or resync) resends the text so far as one delta
      rec.cp = 0;
      rec.streaming = true;
      if (typeof f.seq === "number" && rec.seq !== f.seq) {
        rec.seq = f.seq;
        paint(rec);
        place(rec);
      }
    } else {
      const seq = typeof f.seq === "number" ? f.seq : null;
      rec = newRecord({ id: f.id, seq, role: "bot", text: "", streaming: true, route: f.route });
      byId.set(rec.id, rec);
      paint(rec);
      place(rec);
    }
    rec.el.classList.remove("is-stalled");
    rec.lastFrameAt = Date.now();
    noteSeq(rec);
    hideThinking();
    repaintSoon(rec);
  }

  function onStreamDelta(f) {
    let rec = byId.get(f.id);
    if (!rec) {
      // A delta without its start (its start was missed): show it, and ask for what is missing.
      onStreamStart({ id: f.id, seq: null });
      rec = byId.get(f.id);
    }
    if (!rec.streaming || typeof f.text !== "string") return;
    rec.lastFrameAt = Date.now();
    const points = Array.from(f.text); // pos counts code points, not UTF-16 units
    const pos = typeof f.pos === "number" ? f.pos : rec.cp;
    if (pos > rec.cp) {
      requestResync(); // deltas were missed: the replay resends the text so far
      return;
    }
    if (pos + points.length <= rec.cp) return; // already shown
    const fresh = pos < rec.cp ? points.slice(rec.cp - pos).join("") : f.text;
    rec.text += fresh;
    rec.cp = pos + points.length;
    repaintSoon(rec);
  }

  function onStreamEnd(f) {
    let rec = byId.get(f.id);
    if (!rec) {
      rec = newRecord({ id: f.id, seq: typeof f.seq === "number" ? f.seq : null, role: "bot" });
      byId.set(rec.id, rec);
      place(rec);
    }
    const wasDone = rec.endedByStream && !rec.streaming;
    if (typeof f.text === "string") rec.text = f.text;
    if (Array.isArray(f.cards)) rec.cards = f.cards;
    rec.streaming = false;
    rec.endedByStream = true;
    rec.cut = !!f.cut;
    rec.superseded = !!f.superseded;
    if (f.route) rec.route = f.route;
    const seqChanged = typeof f.seq === "number" && f.seq !== rec.seq;
    if (typeof f.seq === "number") rec.seq = f.seq;
    repaintQueue.delete(rec);
    paint(rec);
    if (seqChanged) place(rec);
    rec.el.classList.remove("is-stalled");
    noteSeq(rec);
    if (rec.superseded) return; // the shopper is still typing: the answer to it all comes next
    hideThinking();
    if (!wasDone) announce(T.said(T.bot, rec.text + (rec.cut ? ` ${T.interrupted}` : "")));
    if (nearBottom()) scrollToEnd();
  }

  function onError(f) {
    if (f.code === "replay_limited") return onReplayLimited(f); // nothing lost: asked again later
    if (typeof f.code === "string" && f.code.startsWith("identity_")) {
      // For the store's developer, not the shopper (the socket closes with 4401 next).
      console.warn(`kefu: ${f.code}: ${f.message}`);
      return;
    }
    if (state.contactPending !== null && f.code === "invalid" && !f.client_id) {
      // The address the shopper just sent was refused: say so beside the form.
      state.contactPending = null;
      contactError.textContent = T.contactInvalid;
      updateContact();
      return;
    }
    showError(errorText(f));
    hideThinking();
    const rec = f.client_id ? pending.get(f.client_id) : null;
    if (rec) {
      // Refused by the server: not stored, so it leaves the outbox; some refusals can be retried.
      dropFromOutbox(rec.client_id);
      sentOnSocket.delete(rec.client_id);
      rec.pendingSend = false;
      rec.failed = true;
      rec.retryable = f.code === "rate_limited" || f.code === "unavailable";
      rec.failedAfter = maxSeq() + 0.25;
      paint(rec);
      place(rec);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Sending
  function dropFromOutbox(clientId) {
    const before = outbox.length;
    outbox = outbox.filter((o) => o.client_id !== clientId);
    if (outbox.length !== before) saveOutbox();
  }

  function transmit(rec) {
    if (!state.ready || sentOnSocket.has(rec.client_id)) return;
    const frame = { type: "message", client_id: rec.client_id, text: rec.text };
    if (rec.attachments && rec.attachments.length) frame.attachments = rec.attachments.map((a) => a.id);
    if (send(frame)) sentOnSocket.add(rec.client_id);
  }

  function flushOutbox() {
    for (const item of outbox) {
      const rec = pending.get(item.client_id);
      if (rec) transmit(rec);
    }
  }

  function showPending(clientId, text, attachments) {
    const rec = newRecord({
      role: "shopper",
      text,
      client_id: clientId,
      pendingSend: true,
      attachments: attachments || [],
    });
    pending.set(clientId, rec);
    paint(rec);
    place(rec);
    return rec;
  }

  /** Queue a shopper message: shown at once as pending, kept in the outbox until acknowledged. */
  function sendText(raw) {
    const text = String(raw == null ? "" : raw).replace(/\r\n?/g, "\n").trim();
    if (!text) return null;
    if (codePoints(text) > MAX_CHARS) {
      showError(T.tooLong(MAX_CHARS));
      return null;
    }
    clearError();
    const clientId = uuid();
    outbox.push({ client_id: clientId, text });
    saveOutbox();
    const rec = showPending(clientId, text);
    scrollToEnd();
    if (!state.ws) connect();
    else transmit(rec);
    return clientId;
  }

  function resend(rec) {
    if (!rec.failed) return;
    rec.failed = false;
    rec.pendingSend = true;
    outbox.push({ client_id: rec.client_id, text: rec.text, attachments: rec.attachments || [] });
    saveOutbox();
    paint(rec);
    place(rec);
    clearError();
    if (!state.ws) connect();
    else transmit(rec);
  }

  function rate(rec, rating) {
    if (rec.id == null || rec.rating === rating) return;
    if (!send({ type: "feedback", message_id: rec.id, rating })) return;
    rec.rating = rating;
    // Update in place (no re-render), so keyboard focus stays on the button.
    for (const b of rec.meta.querySelectorAll(".kefu-rate")) {
      b.setAttribute("aria-pressed", String(b.classList.contains(`kefu-rate--${rating}`)));
    }
    const thanks = rec.meta.querySelector(".kefu-thanks");
    if (thanks) thanks.textContent = T.thanks;
  }

  /** Feedback is asked on answers only, not on a greeting sent before the shopper spoke. */
  function isAnswer(rec) {
    if (rec.endedByStream) return true;
    for (const other of byId.values()) {
      if (other.role === "shopper" && other.seq != null && rec.seq != null && other.seq < rec.seq) return true;
    }
    return false;
  }

  // ---------------------------------------------------------------------------------------------
  // Input
  function autosize() {
    input.style.height = "auto";
    input.style.height = `${Math.min(input.scrollHeight, 140)}px`;
  }

  function updateComposer() {
    const n = codePoints(input.value);
    const over = n > MAX_CHARS;
    counter.hidden = n < COUNTER_FROM;
    counter.replaceChildren(document.createTextNode(T.counter(n, MAX_CHARS)), h("span", "kefu-sr", T.counterUnit));
    counter.classList.toggle("is-over", over);
    hint.hidden = !counter.hidden;
    input.setAttribute("aria-invalid", String(over));
    sendBtn.disabled = over || !input.value.trim();
  }

  input.addEventListener("input", () => {
    autosize();
    updateComposer();
    if (root.classList.contains("has-error") && codePoints(input.value) <= MAX_CHARS) clearError();
    const now = Date.now();
    if (input.value.trim() && state.ready && now - state.lastTypingAt >= TYPING_EVERY_MS) {
      if (send({ type: "typing" })) state.lastTypingAt = now;
    }
  });

  input.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.shiftKey || event.isComposing || event.keyCode === 229) return;
    event.preventDefault();
    submit();
  });

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit();
  });

  // ---------------------------------------------------------------------------------------------
  // Attachments: each file is uploaded (POST /api/chat/attachments, with the conversation's id and
  // token in headers; XHR for its progress), then sent as a message of its own (text empty).
  const uploads = [];
  let uploading = false;

  function uploadError(code) {
    showError(T.attachErrors[code] || T.attachErrors.generic);
  }

  function queueFiles(list) {
    for (const file of Array.from(list || [])) uploads.push(file);
    if (!state.conversation) {
      if (!state.ws) connect();
      return; // uploaded once the conversation is known (onConversation calls pumpUploads)
    }
    pumpUploads();
  }

  function pumpUploads() {
    if (uploading || !uploads.length || !state.conversation || !state.token) return;
    const file = uploads.shift();
    uploading = true;
    clearError();
    const xhr = new XMLHttpRequest();
    xhr.open("POST", new URL("/api/chat/attachments", SERVER.origin).href);
    xhr.setRequestHeader("X-Kefu-Conversation", state.conversation);
    xhr.setRequestHeader("X-Kefu-Token", state.token);
    xhr.responseType = "json";
    progress.hidden = false;
    progress.value = 0;
    progress.setAttribute("aria-label", T.attachUploading(file.name || ""));
    xhr.upload.addEventListener("progress", (e) => {
      if (e.lengthComputable) progress.value = Math.round((e.loaded / e.total) * 100);
    });
    const done = () => {
      uploading = false;
      progress.hidden = true;
      pumpUploads();
    };
    xhr.addEventListener("load", () => {
      const body = xhr.response || {};
      if (xhr.status === 201 && body.id) sendFiles([body]);
      else uploadError(body.error && body.error.code);
      done();
    });
    xhr.addEventListener("error", () => {
      uploadError("generic");
      done();
    });
    const data = new FormData();
    data.append("file", file, file.name || "photo");
    xhr.send(data);
  }

  /** Send uploaded files as one shopper message (shown at once as pending, kept in the outbox). */
  function sendFiles(attachments) {
    const clientId = uuid();
    outbox.push({ client_id: clientId, text: "", attachments });
    saveOutbox();
    const rec = showPending(clientId, "", attachments);
    scrollToEnd();
    if (!state.ws) connect();
    else transmit(rec);
  }

  attachBtn.addEventListener("click", () => fileInput.click());
  fileInput.addEventListener("change", () => {
    queueFiles(fileInput.files);
    fileInput.value = "";
  });
  input.addEventListener("paste", (event) => {
    const pasted = event.clipboardData && event.clipboardData.files;
    if (pasted && pasted.length) {
      event.preventDefault();
      queueFiles(pasted);
    }
  });
  panel.addEventListener("dragover", (event) => {
    if (event.dataTransfer && Array.from(event.dataTransfer.types || []).includes("Files")) {
      event.preventDefault();
      root.classList.add("is-dragging");
    }
  });
  panel.addEventListener("dragleave", () => root.classList.remove("is-dragging"));
  panel.addEventListener("drop", (event) => {
    root.classList.remove("is-dragging");
    if (event.dataTransfer && event.dataTransfer.files && event.dataTransfer.files.length) {
      event.preventDefault();
      queueFiles(event.dataTransfer.files);
    }
  });

  function submit() {
    const text = input.value;
    if (!text.trim()) return;
    if (codePoints(text) > MAX_CHARS) {
      showError(T.tooLong(MAX_CHARS));
      return;
    }
    if (sendText(text)) {
      input.value = "";
      autosize();
      updateComposer();
      state.lastTypingAt = 0; // the next message's typing is announced at once, not throttled
    }
    input.focus();
  }

  // ---------------------------------------------------------------------------------------------
  // Open / close
  function open() {
    if (!state.open) {
      state.open = true;
      panel.hidden = false;
      root.classList.add("is-open");
      launcher.setAttribute("aria-expanded", "true");
      updateUnread();
      scrollToEnd();
    }
    if (!state.ws) connect();
    // Focus after the panel is laid out (it is display:none until now).
    requestAnimationFrame(() => input.focus());
  }

  function close() {
    if (!state.open) return;
    const hadFocus = shadow.activeElement && panel.contains(shadow.activeElement);
    state.open = false;
    panel.hidden = true;
    root.classList.remove("is-open");
    launcher.setAttribute("aria-expanded", "false");
    updateUnread();
    if (hadFocus) launcher.focus();
  }

  launcher.addEventListener("click", () => (state.open ? close() : open()));
  closeBtn.addEventListener("click", close);
  personBtn.addEventListener("click", () => {
    if (send({ type: "ask_person" })) personBtn.hidden = true;
  });
  root.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.open) {
      event.stopPropagation();
      close();
      launcher.focus();
    }
  });

  // Integrator hook: any element with data-kefu-open opens the chat; data-kefu-ask="question"
  // also puts the question in the input (not sent: the shopper decides).
  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target.closest("[data-kefu-open],[data-kefu-ask]") : null;
    if (!target) return;
    event.preventDefault();
    const question = target.getAttribute("data-kefu-ask");
    if (question) {
      input.value = question;
      autosize();
      updateComposer();
    }
    open();
  });

  // ---------------------------------------------------------------------------------------------
  // Public API
  window.kefu = Object.freeze({
    __kefuWidget: true,
    open,
    close,
    /** Send `text` as the shopper. Returns its client_id, or null when blank or too long. */
    send: sendText,
    /** A snapshot: {conversation, connected, messageCount, open, status, pending, locale}. */
    state() {
      return {
        conversation: state.conversation,
        connected: state.ready,
        messageCount: messageCount(),
        open: state.open,
        status: state.status,
        pending: pending.size,
        locale: LOCALE,
      };
    },
  });

  // ---------------------------------------------------------------------------------------------
  // The transcript on request (docs/email.md): once the conversation is closed, a form sends it
  // by e-mail (POST /api/chat/transcript with the conversation's id and token in headers).
  const TRANSCRIPT_T = {
    en: {
      prompt: "Want a copy of this conversation? We'll e-mail you the transcript:",
      send: "E-mail it",
      queued: (email) => `The transcript is on its way to ${email}.`,
      failed: "Sorry, the transcript could not be sent. Please try again.",
    },
    zh: {
      prompt: "需要这段对话的副本吗？我们可以把对话记录发到您的邮箱：",
      send: "发送到邮箱",
      queued: (email) => `对话记录正在发送到 ${email}。`,
      failed: "抱歉，对话记录发送失败，请重试。",
    },
  }[UI];
  const {
    box: transcriptBox,
    form: transcriptForm,
    input: transcriptInput,
    btn: transcriptBtn,
    error: transcriptError,
  } = emailForm("transcript", TRANSCRIPT_T.prompt, TRANSCRIPT_T.send);
  contactBox.after(transcriptBox);
  let transcriptSent = null; // the conversation whose transcript was asked for

  function updateTranscript() {
    transcriptBox.hidden = !(state.status === "closed" && state.conversation && transcriptSent !== state.conversation);
  }

  transcriptForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const email = transcriptInput.value.trim();
    if (!email || !transcriptInput.checkValidity()) {
      transcriptError.textContent = T.contactInvalid;
      return;
    }
    if (!state.conversation || !state.token) return;
    transcriptError.textContent = "";
    transcriptBtn.disabled = true;
    const conversation = state.conversation;
    fetch(new URL("/api/chat/transcript", SERVER).href, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Kefu-Conversation": conversation, "X-Kefu-Token": state.token },
      body: JSON.stringify({ email }),
      credentials: "omit",
    })
      .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
      .then(() => {
        transcriptSent = conversation;
        transcriptInput.value = "";
        addNotice(TRANSCRIPT_T.queued(email));
        updateTranscript();
      })
      .catch(() => {
        transcriptError.textContent = TRANSCRIPT_T.failed;
      })
      .finally(() => {
        transcriptBtn.disabled = false;
      });
  });

  // ---------------------------------------------------------------------------------------------
  // Resuming from an e-mail (docs/email.md): the link of an e-mailed reply opens this page with
  // #kefu-resume=CODE. The code is taken off the address bar at once, exchanged once
  // (POST /api/chat/resume) for the conversation and a token, and the chat opens on it.
  const RESUME_T = {
    en: { expired: "This link was already used or has expired. You can still write to us here." },
    zh: { expired: "此链接已使用或已过期。您仍可以在这里给我们留言。" },
  }[UI];

  function resumeCodeFromLink() {
    const match = /(?:^#|&)kefu-resume=([\w-]{8,100})/.exec(window.location.hash || "");
    if (!match) return null;
    try {
      const rest = window.location.hash.replace(match[0], "").replace(/^#&?/, "");
      const url = window.location.pathname + window.location.search + (rest ? "#" + rest : "");
      window.history.replaceState(window.history.state, "", url);
    } catch (_) {
      // a sandboxed frame: the code stays in the address bar, and is spent anyway
    }
    return match[1];
  }

  function resumeFromLink() {
    const code = resumeCodeFromLink();
    if (!code) return false;
    fetch(new URL("/api/chat/resume", SERVER).href, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ code }),
      credentials: "omit",
    })
      .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
      .then((body) => {
        if (state.ws) state.ws.close();
        state.ws = null;
        if (state.conversation !== String(body.conversation)) clearConversationView();
        state.conversation = String(body.conversation);
        state.token = String(body.token);
        storage.set("conversation", { id: state.conversation, token: state.token });
        open();
      })
      .catch(() => {
        open();
        addNotice(RESUME_T.expired);
      });
    return true;
  }

  // ---------------------------------------------------------------------------------------------
  // Start
  function mount() {
    document.body.appendChild(host);
    updateHeader();
    updateUnread();
    updateComposer();
    for (const item of outbox) showPending(item.client_id, item.text, item.attachments);
    if (resumeFromLink()) return;
    if (script.dataset.open === "true") open();
    else if (state.conversation || outbox.length) connect(); // resume: agent replies, unread badge
  }
  if (document.body) mount();
  else document.addEventListener("DOMContentLoaded", mount, { once: true });
})();
