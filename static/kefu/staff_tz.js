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
  if (!zone) return;
  var current = (document.cookie.match(/(?:^|;\s*)kefu_tz=([^;]*)/) || [])[1];
  if (current && decodeURIComponent(current) === zone) return;
  document.cookie = "kefu_tz=" + encodeURIComponent(zone) + "; path=/; max-age=31536000; samesite=lax";
})();
