// Feeds each file named on the command line to Mermaid's own parser (mermaid.parse), which
// needs a DOM: jsdom stands in for the browser. Prints "PATH<TAB>first line of the error" for
// each file it rejects and exits 1 if any. By hand: `node tests/mermaid/parse.mjs FILE...`
// after `npm ci` in tests/mermaid; tests/test_diagram.py passes this text to `node -e` with
// $TETHER_MERMAID_DIR as the working directory, so the modules may be installed elsewhere.
import { JSDOM } from "jsdom";
import { readFileSync } from "node:fs";

const dom = new JSDOM("<!doctype html><html><body></body></html>");
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import("mermaid");
mermaid.initialize({ startOnLoad: false });

let failed = 0;
// argv[1] is this file when run as `node parse.mjs`; under `node -e` the files start there.
const paths = process.argv.slice(1).filter((path) => path !== import.meta.filename);
for (const path of paths) {
  try {
    await mermaid.parse(readFileSync(path, "utf8"));
  } catch (error) {
    failed++;
    console.log(`${path}\t${error.message.split("\n")[0]}`);
  }
}
process.exit(failed ? 1 : 0);
