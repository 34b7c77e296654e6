// tether ui: live pages. A page whose <main> has data-live listens to that server-sent event
// stream and, when it says "changed", fetches its own address again and swaps its <main> in.
// Nothing else runs here: forms post as plain HTML forms, and the server escapes every text it shows.
//
// A swap never throws away what a person did on the page:
// - While a field has the focus, or any field holds a value other than the one the server rendered
//   (typed, picked, ticked), the swap waits: <main data-state="stale"> says newer state is held back
//   until the form is sent or its edits undone. What a form sends is always what the person sees.
// - The view's own choices (inputs marked data-view: the timeline's filter) are kept, and never hold a swap back.
// - The <details> panels that were open are opened again, each known by its form's hidden fields
//   (the run, the call, the step), which of the forms with those it is (rows of the timeline share
//   them; the timeline only grows at its end), and its place in that form; or by data-key if it has one.
// The address fetched again is the page's own: data-page on <main> if the server gives it, else
// the run's or the inbox's, from the stream. A refused form is answered at /decide or /fork, which
// cannot be fetched again; the address bar is set to the page's own too, so a reload posts nothing.
"use strict";

(function () {
  const main = document.getElementById("live");
  if (!main) {
    return;
  }
  const FORMS = ["/decide", "/fork"]; // where a refused form is answered with a page

  function canonical() {
    // The page's own address, as a path and query.
    const here = window.location.pathname + window.location.search;
    const page = main.dataset.page; // (its query, a list's filters, is the address bar's when the path is the same)
    if (page) return new URL(page, window.location.href).pathname === window.location.pathname ? here : page;
    if (!FORMS.includes(window.location.pathname) || !main.dataset.live) return here;
    const stream = new URL(main.dataset.live, window.location.href).pathname;
    const run = /^(\/runs\/[^/]+)\/live$/.exec(stream);
    if (run) return run[1];
    return stream === "/live" ? "/inbox" : here; // the only list a form answers with is the inbox
  }

  const home = canonical();
  if (home !== window.location.pathname + window.location.search && window.history.replaceState) {
    window.history.replaceState(window.history.state, "", home);
  }
  if (!main.dataset.live || !window.EventSource) {
    return;
  }

  let pending = false; // a change came that the page does not show yet
  let failed = false; // the page could not be fetched again
  let ended = false; // the stream said the run ended
  let signedOut = false; // the stream said the session ended
  let ticket = 0; // the latest fetch: an older answer is dropped

  function show() {
    main.dataset.state = signedOut ? "signed-out" : failed ? "offline" : pending ? "stale" : ended ? "ended" : "live";
  }

  function edited(field) {
    // Whether a field holds something other than what the server rendered in it.
    if (field.disabled || /^(hidden|submit|button|reset|image|file)$/.test(field.type)) return false;
    if (field.hasAttribute("data-view")) return false; // how the page is shown (a filter), not what a form sends
    if (field.type === "checkbox" || field.type === "radio") return field.checked !== field.defaultChecked;
    if (field.tagName === "SELECT") {
      const options = Array.from(field.options);
      if (field.multiple) return options.some((option) => option.selected !== option.defaultSelected);
      let initial = 0; // with no option marked selected, a single select shows its first
      options.forEach((option, index) => {
        if (option.defaultSelected) initial = index;
      });
      return options.length > 0 && field.selectedIndex !== initial;
    }
    return field.value !== field.defaultValue;
  }

  function busy() {
    // Someone is typing in a form, or has typed in one: swapping the page now would lose it.
    const active = document.activeElement;
    if (active && main.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return true;
    return Array.from(main.querySelectorAll("input, textarea, select")).some(edited);
  }

  function keys() {
    // Each panel with a name for it that the page fetched again gives it too: its form's hidden
    // fields (rows of the timeline share theirs: then which of those forms), and its place there.
    const forms = new Map();
    const seen = new Map();
    main.querySelectorAll("form").forEach((form) => {
      const fields = Array.from(form.querySelectorAll("input[type=hidden]")).filter((field) => field.name !== "csrf");
      const named = [form.getAttribute("action") || ""].concat(fields.map((field) => field.name + "=" + field.value));
      const signature = named.join("\n");
      const nth = seen.get(signature) || 0;
      seen.set(signature, nth + 1);
      forms.set(form, signature + "\n" + nth);
    });
    return Array.from(main.querySelectorAll("details"), (details) => {
      if (details.dataset.key) return [details, details.dataset.key];
      const form = details.closest("form");
      let scope = main;
      let where = "";
      if (forms.has(form)) {
        scope = form;
        where = forms.get(form);
      } else {
        const owner = details.parentElement && details.parentElement.closest("[id]");
        if (owner && owner !== main && main.contains(owner)) {
          scope = owner;
          where = "#" + owner.id;
        }
      }
      return [details, where + "\n" + Array.prototype.indexOf.call(scope.querySelectorAll("details"), details)];
    });
  }

  function swap(page, fresh) {
    const open = new Set(keys().filter(([details]) => details.open).map(([, name]) => name));
    const views = new Map(Array.from(main.querySelectorAll("input[data-view][id]"), (input) => [input.id, input.checked]));
    main.replaceChildren(...Array.from(fresh.childNodes, (node) => document.importNode(node, true)));
    if (fresh.dataset.waiting) main.dataset.waiting = fresh.dataset.waiting; // what the live badge says it waits for
    else delete main.dataset.waiting;
    keys().forEach(([details, name]) => {
      if (open.has(name)) details.open = true;
    });
    views.forEach((checked, id) => {
      const input = document.getElementById(id);
      if (input) input.checked = checked;
    });
    const header = page.querySelector("header.top");
    const current = document.querySelector("header.top");
    if (header && current) current.replaceWith(document.importNode(header, true));
    document.title = page.title;
    ended = ended || !fresh.dataset.live;
  }

  async function refresh() {
    pending = true;
    if (busy()) {
      show();
      return;
    }
    const mine = ++ticket;
    let page = null;
    try {
      const answer = await fetch(home, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (answer.ok) page = new DOMParser().parseFromString(await answer.text(), "text/html");
    } catch (error) {
      page = null;
    }
    if (mine !== ticket) return; // a later change fetched the page again
    const fresh = page && page.getElementById("live");
    if (!fresh) {
      failed = true; // the next change tries again
    } else if (!busy()) {
      // (someone may have started typing while the page was fetched: then it waits)
      failed = false;
      pending = false;
      swap(page, fresh);
    }
    show();
  }

  function retry() {
    // A field was left, changed or reset: the held-back state may be shown now.
    if (pending) setTimeout(refresh, 0);
  }

  main.addEventListener("focusout", retry);
  main.addEventListener("input", retry);
  main.addEventListener("change", retry);
  main.addEventListener("reset", retry);

  const stream = new EventSource(main.dataset.live);
  show();
  stream.addEventListener("changed", refresh);
  stream.addEventListener("end", () => {
    stream.close();
    ended = true;
    show();
  });
  stream.addEventListener("signed-out", () => {
    // The session ended (signed out here or in another tab, or timed out): nothing more comes.
    stream.close();
    signedOut = true;
    show();
  });
})();

// Forms. A form whose effect is hard to take back asks first, in the page's <dialog>:
// - "Approve" on a call whose input was edited asks whether to approve the edit (the server refuses
//   a plain approval of an edited input, so without this script the person is told instead);
// - a form or button with data-confirm asks that question (cancel, resume, retry, fork); the
//   server asks again on a page of its own when the answer did not come from here (no script).
(function () {
  const dialog = document.getElementById("confirm");
  if (!dialog || typeof dialog.showModal !== "function") return;
  const CONFIRMED = "confirmed"; // the field saying the question was answered here

  function ask(title, text, detail, yes, tone) {
    dialog.querySelector("#confirm-title").textContent = title;
    dialog.querySelector(".confirm-text").textContent = text;
    const shown = dialog.querySelector(".confirm-detail");
    shown.textContent = detail || "";
    shown.hidden = !detail;
    const button = dialog.querySelector("[data-testid=confirm-yes]");
    button.textContent = yes;
    button.className = tone || "approve";
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    });
  }

  function canonical(text) {
    // JSON as one spelling (keys sorted), or null when it is not JSON.
    function sorted(value) {
      if (Array.isArray(value)) return value.map(sorted);
      if (value && typeof value === "object") {
        const out = {};
        Object.keys(value)
          .sort()
          .forEach((key) => {
            out[key] = sorted(value[key]);
          });
        return out;
      }
      return value;
    }
    try {
      return JSON.stringify(sorted(JSON.parse(text)));
    } catch (error) {
      return null;
    }
  }

  function editedInput(form) {
    // The edited input's text when it differs from what the server showed, else null.
    const field = form.querySelector("textarea[name=input]");
    if (!field || field.value === field.defaultValue) return null;
    const now = canonical(field.value);
    return now !== null && now === canonical(field.defaultValue) ? null : field.value;
  }

  function shown(value) {
    // A value as JSON, but a text of several lines as its lines, indented (not one line of \n escapes).
    if (typeof value !== "string" || !value.includes("\n")) return " " + JSON.stringify(value);
    return "\n    " + value.split("\n").join("\n    ");
  }

  function changes(before, after) {
    // What changed, key by key ("amount: 20 → 5"; a text of several lines: was, then now, each its lines),
    // when both are JSON objects.
    let old, now;
    try {
      old = JSON.parse(before);
      now = JSON.parse(after);
    } catch (error) {
      return [];
    }
    if (!old || !now || typeof old !== "object" || typeof now !== "object") return [];
    const keys = Array.from(new Set(Object.keys(old).concat(Object.keys(now))));
    return keys
      .filter((key) => canonical(JSON.stringify(old[key])) !== canonical(JSON.stringify(now[key])))
      .map((key) => {
        const was = key in old ? shown(old[key]) : " (not given)";
        const is = key in now ? shown(now[key]) : " (left out)";
        if (!was.includes("\n") && !is.includes("\n")) return key + ":" + was + " →" + is;
        return key + ":\n  was:" + was + "\n  now:" + is;
      });
  }

  function resend(form, submitter) {
    let mark = form.querySelector("input[name=" + CONFIRMED + "]");
    if (!mark) {
      mark = document.createElement("input");
      mark.type = "hidden";
      mark.name = CONFIRMED;
      form.appendChild(mark);
    }
    mark.value = "1";
    form.requestSubmit(submitter);
  }

  // Edit forms: the fields and the raw JSON say one input. Typing in a field writes the raw JSON
  // from the fields (each number and JSON field as typed, so the server reads both alike); typing in
  // the raw JSON sets the fields aside (disabled: not sent) until it is undone. Without this script
  // both are sent, and the server refuses them if they disagree.
  const KIND = "t.";
  const VALUE = "f.";

  function fromFields(form) {
    // The input the fields say, as JSON text; null while a field cannot be read (the server says why).
    const parts = [];
    for (const marker of form.querySelectorAll("input[name^='" + KIND + "']")) {
      const key = marker.name.slice(KIND.length);
      const field = form.elements.namedItem(VALUE + key);
      const optional = marker.value.endsWith("?");
      const kind = optional ? marker.value.slice(0, -1) : marker.value;
      const text = field ? field.value : "";
      let json;
      if (kind === "string" || kind === "text") {
        if (optional && text === "") continue;
        json = JSON.stringify(text);
      } else {
        if (text.trim() === "") continue;
        try {
          const value = JSON.parse(text);
          if (kind !== "json" && typeof value !== "number") return null;
        } catch (error) {
          return null;
        }
        json = text.trim();
      }
      parts.push("  " + JSON.stringify(key) + ": " + json.replace(/\n/g, "\n  "));
    }
    return parts.length ? "{\n" + parts.join(",\n") + "\n}" : "{}";
  }

  document.addEventListener("input", (event) => {
    const field = event.target;
    const form = field && field.form;
    if (!form || !form.classList.contains("decide")) return;
    const raw = form.querySelector("textarea[name=input]");
    if (!raw) return;
    if (field.name && field.name.startsWith(VALUE)) {
      const text = fromFields(form);
      if (text !== null) raw.value = text;
    } else if (field === raw) {
      const said = fromFields(form);
      const aside = said === null || canonical(raw.value) !== canonical(said);
      form.querySelectorAll("[name^='" + VALUE + "'], [name^='" + KIND + "']").forEach((each) => {
        each.disabled = aside;
      });
      const fields = form.querySelector(".fields");
      if (fields) fields.classList.toggle("set-aside", aside);
    }
  });

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || form.method === "dialog") return;
    const submitter = event.submitter;
    const done = form.querySelector("input[name=" + CONFIRMED + "]");
    if (done && done.value === "1") return; // answered: send it
    if (form.classList.contains("decide") && submitter && submitter.value === "approve") {
      const edited = editedInput(form);
      if (edited === null) return;
      event.preventDefault();
      const tool = form.dataset.tool || "the tool";
      const text = "You changed the input of " + tool + ". Approve runs it with the input below, not the one shown.";
      const edit = form.querySelector("button[value=edit]");
      const before = form.querySelector("textarea[name=input]").defaultValue;
      const detail = changes(before, edited).concat(["", edited]).join("\n");
      ask("Approve the edited input?", text, detail, "Approve the edited input").then((yes) => {
        if (yes && edit) resend(form, edit);
      });
      return;
    }
    if (form.classList.contains("decide-all") && submitter && submitter.value === "approve-all") {
      const turn = form.closest(".turn");
      const edited = Array.from(turn ? turn.querySelectorAll("form.decide") : [])
        .filter((card) => editedInput(card) !== null)
        .map((card) => card.dataset.tool || "a call");
      if (!edited.length) return;
      event.preventDefault();
      const text =
        "You edited the input of " + edited.join(", ") + ". Approve all approves every call with the input shown, " +
        "not your edit (to approve your edit, use Approve the edited input on its card first).";
      ask("Approve all as shown?", text, "", "Approve all as shown").then((yes) => {
        if (yes) resend(form, submitter);
      });
      return;
    }
    const question = (submitter && submitter.dataset.confirm) || form.dataset.confirm;
    if (!question) return;
    event.preventDefault();
    const title = (submitter && submitter.dataset.confirmTitle) || form.dataset.confirmTitle || "Are you sure?";
    const yes = (submitter && submitter.dataset.confirmYes) || form.dataset.confirmYes || "Yes";
    const tone = (submitter && submitter.dataset.confirmTone) || form.dataset.confirmTone || "approve";
    ask(title, question, "", yes, tone).then((answer) => {
      if (answer) resend(form, submitter);
    });
  });
})();
