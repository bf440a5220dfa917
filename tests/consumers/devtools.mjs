// Loads a Chrome JSON trace in Chrome DevTools' own trace engine (@paulirish/trace_engine)
// and prints, as JSON, what DevTools found in it: per process its name and threads, per
// routine the number of slices and the sum of their `bytes` arguments, the pairs of
// (enclosing routine, nested routine) of its call trees, and the flows.
//
// Usage: node devtools.mjs TRACE.json
import fs from 'node:fs';
import * as Trace from '@paulirish/trace_engine/models/trace/trace.js';

// The engine measures layout with DOMRect, which Node lacks.
globalThis.DOMRect ??= class DOMRect {
  constructor(x = 0, y = 0, width = 0, height = 0) {
    Object.assign(this, {x, y, width, height});
  }
};

const json = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const model = Trace.TraceModel.Model.createWithAllHandlers();
await model.parse(json.traceEvents ?? json);
const data = model.parsedTrace().data;

const out = {processes: {}, flows: []};
const names = data.Meta.processNames;
for (const [pid, proc] of data.Renderer.processes) {
  const p = {name: names.get(pid)?.args?.name ?? null, threads: {}, routines: {}, nested: []};
  for (const [tid, thread] of proc.threads) {
    p.threads[tid] = thread.name ?? null;
    for (const e of thread.entries) {
      const r = (p.routines[e.name] ??= {slices: 0, bytes: 0});
      r.slices += 1;
      r.bytes += e.args?.bytes ?? 0;
    }
    const walk = (node) => {
      for (const child of node.children) {
        p.nested.push([node.entry.name, child.entry.name]);
        walk(child);
      }
    };
    for (const root of thread.tree?.roots ?? []) walk(root);
  }
  out.processes[pid] = p;
}
for (const flow of data.Flows.flows) {
  out.flows.push(flow.map((e) => ({pid: e.pid, tid: e.tid, name: e.name, ts: e.ts})));
}
out.metadata = json.metadata ?? null;
console.log(JSON.stringify(out));
