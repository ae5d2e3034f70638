// Staff pages show times in the agent's time zone (config/staff_locale.py): tell the server the
// browser's IANA zone in the kefu_tz cookie; the next page load uses it.
(function () {
  "use strict";
  var zone;
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  } catch (e) {
    return;
  }
  // IANA names ("Asia/Shanghai", "Etc/GMT+8") are cookie-safe as they are; the server does not
  // percent-decode cookies, so the name is written unencoded and anything else is left out.
  if (!zone || !/^[A-Za-z0-9_+\/-]{1,64}$/.test(zone)) return;
  var current = (document.cookie.match(/(?:^|;\s*)kefu_tz=([^;]*)/) || [])[1];
  if (current === zone) return;
  document.cookie = "kefu_tz=" + zone + "; path=/; max-age=31536000; samesite=lax";
})();
