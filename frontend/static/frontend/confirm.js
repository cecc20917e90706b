/* Forms marked data-confirm (cancel a job, cancel several) ask in a dialog before they are sent, and send
   `confirmed` once the answer is yes. Without this script the server asks on a page of its own instead. */
(function () {
  "use strict";
  const dialog = document.getElementById("confirm-dialog");

  function send(form, submitter) {
    const flag = document.createElement("input");
    flag.type = "hidden";
    flag.name = "confirmed";
    flag.value = "1";
    form.appendChild(flag);
    if (submitter) form.requestSubmit(submitter);
    else form.requestSubmit();
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.dataset.confirm) return;
    if (form.querySelector("input[name=confirmed]")) return; // answered already
    // A button that sends the form elsewhere (compare the ticked jobs) changes nothing: no question.
    if (event.submitter && event.submitter.hasAttribute("data-no-confirm")) return;
    let message = form.dataset.confirm;
    if (form.dataset.confirmCount) {
      const count = form.querySelectorAll(form.dataset.confirmCount).length;
      if (count === 0) {
        event.preventDefault();
        window.alert(form.dataset.confirmNone);
        return;
      }
      message = message.replace("%(count)s", String(count));
    }
    if (!dialog || typeof dialog.showModal !== "function") return; // the server's page asks instead
    event.preventDefault();
    const submitter = event.submitter;
    dialog.querySelector("#confirm-question").textContent = message;
    dialog.returnValue = "";
    dialog.addEventListener(
      "close",
      () => {
        if (dialog.returnValue === "yes") send(form, submitter);
        else if (submitter) submitter.focus();
      },
      { once: true },
    );
    dialog.showModal();
  });
})();
