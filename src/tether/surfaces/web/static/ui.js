// tether ui: live pages. A page whose <main> has data-live listens to that server-sent event
// stream and, when it says "changed", fetches itself again and swaps its <main> in. Nothing
// else runs here: forms post as plain HTML forms, and the server escapes every text it shows.
"use strict";

(function () {
  const main = document.getElementById("live");
  if (!main || !main.dataset.live || !window.EventSource) {
    return;
  }
  let pending = false;

  function busy() {
    // Someone is typing in a form: swapping the page now would lose it.
    const active = document.activeElement;
    return active && main.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName);
  }

  async function refresh() {
    if (busy()) {
      pending = true;
      return;
    }
    pending = false;
    const answer = await fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (!answer.ok) {
      return;
    }
    const page = new DOMParser().parseFromString(await answer.text(), "text/html");
    const fresh = page.getElementById("live");
    if (fresh) {
      const open = new Set(Array.from(main.querySelectorAll("details[open]"), (d) => d.closest("[id]")?.id));
      main.replaceChildren(...Array.from(fresh.childNodes, (node) => document.importNode(node, true)));
      main.querySelectorAll("details").forEach((d) => {
        if (open.has(d.closest("[id]")?.id)) d.open = true;
      });
      const header = page.querySelector("header.top");
      const current = document.querySelector("header.top");
      if (header && current) current.replaceWith(document.importNode(header, true));
      main.dataset.state = fresh.dataset.live ? "live" : "ended";
      document.title = page.title;
    }
  }

  main.addEventListener("focusout", () => {
    if (pending) setTimeout(refresh, 0);
  });

  const stream = new EventSource(main.dataset.live);
  main.dataset.state = "live";
  stream.addEventListener("changed", refresh);
  stream.addEventListener("end", () => {
    stream.close();
    main.dataset.state = "ended";
  });
})();
