/* kefu ops pages (templates/ops_canary.html): a form with data-confirm is sent only once staff
   confirm its question (promote or roll back a canary candidate). No inline script (strict CSP);
   without script the forms still work, unconfirmed. */
(function () {
  "use strict";

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    const question = form.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();
