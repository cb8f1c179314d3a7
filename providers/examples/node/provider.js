#!/usr/bin/env node
// A persistent provisionerd provider in Node.js, with no npm packages.
//
// Protocol: one JSON object per line on stdin, {"id": 7, "action": "listMachines", "input": {...}}, and one per
// line on stdout, {"id": 7, "result": {...}} or {"id": 7, "error": {"code", "message", "retryable"}}. Requests are
// handled concurrently and answered as they finish, in any order. stderr is a free-form log. EOF on stdin: finish
// what is in flight, then exit.
//
// The "cloud" here is a JSON file of machine records in $PRO_DATA_DIR/node-state.json; each call waits
// `latencyMs` as if it talked to a real API. Replace the bodies of the action functions with calls to your
// cloud's SDK and keep everything else.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const readline = require('readline');

const DATA = process.env.PRO_DATA_DIR;
if (!DATA) {
  console.error('node-example: PRO_DATA_DIR is not set');
  process.exit(1);
}
const STATE_FILE = path.join(DATA, 'node-state.json');
const CONFIG_FILE = path.join(process.env.PRO_CONF_DIR || __dirname, 'node-example.json');

// Defaults; $PRO_CONF_DIR/node-example.json may override any of them.
const config = {
  latencyMs: 5,  // how long each "cloud API call" takes
  bootMs: 0,     // how long a new machine stays "pending" before "running"
  templates: [
    {templateId: 'node-small', maxNumber: 20,
     attributes: {type: ['String', 'X86_64'], ncpus: ['Numeric', '4'], mem: ['Numeric', '16384'], ngpus: ['Numeric', '0']}},
    {templateId: 'node-gpu', maxNumber: 2,
     attributes: {type: ['String', 'X86_64'], ncpus: ['Numeric', '16'], mem: ['Numeric', '131072'], ngpus: ['Numeric', '1']}},
  ],
};
// A broken config or state file stops the plugin with a message on stderr (the daemon keeps its tail).
function readJson(file) {
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (err) {
    console.error(`node-example: cannot read ${file}: ${err.message}`);
    process.exit(1);
  }
}
if (fs.existsSync(CONFIG_FILE)) Object.assign(config, readJson(CONFIG_FILE));

// ---- errors: the contract's typed error document -------------------------------------------------------------

const RETRYABLE = new Set(['capacity_unavailable', 'throttled']);

class ProviderError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
  document() {
    return {code: this.code, message: this.message, retryable: RETRYABLE.has(this.code)};
  }
}
const invalid = (message) => new ProviderError('invalid_request', message);

// ---- state: loaded once, kept in memory, saved atomically after every change ----------------------------------

fs.mkdirSync(DATA, {recursive: true});
let state = {counter: 0, ops: {}, requests: {}, machines: {}};
if (fs.existsSync(STATE_FILE)) state = readJson(STATE_FILE);

function save() {
  // Write a temp file, fsync it, rename it over the old one: a crash leaves either the old or the new state.
  const tmp = `${STATE_FILE}.${process.pid}.tmp`;
  const fd = fs.openSync(tmp, 'w', 0o600);
  fs.writeSync(fd, JSON.stringify(state));
  fs.fsyncSync(fd);
  fs.closeSync(fd);
  fs.renameSync(tmp, STATE_FILE);
}

// Mutations run one at a time (reads do not wait): two requests with the same op_id arriving together must not
// both create machines.
let mutationQueue = Promise.resolve();
function exclusively(fn) {
  const run = mutationQueue.then(fn);
  mutationQueue = run.catch(() => {});
  return run;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const cloudCall = () => sleep(config.latencyMs);
const nextId = (prefix) => `${prefix}-${String(++state.counter).padStart(6, '0')}`;
const isLive = (m) => !m.returnedBy;
const machineStatus = (m) => (!isLive(m) ? 'terminated' : Date.now() - m.launchMs < config.bootMs ? 'pending' : 'running');

// ---- input checks ---------------------------------------------------------------------------------------------

const OP_ID = /^[A-Za-z0-9._:-]{1,64}$/;

function opAndTags(input) {
  if (typeof input.op_id !== 'string' || !OP_ID.test(input.op_id)) {
    throw invalid('op_id must be 1-64 characters of [A-Za-z0-9._:-]');
  }
  const tags = input.tags;
  if (!tags || typeof tags !== 'object' || Array.isArray(tags) || typeof tags['provisionerd:cluster'] !== 'string' ||
      !Object.values(tags).every((v) => typeof v === 'string')) {
    throw invalid('tags must be an object of strings carrying provisionerd:cluster');
  }
  return [input.op_id, tags];
}

// The same op_id again returns what it made the first time; the same op_id for a different ask is refused.
function replay(opId, fingerprint) {
  const op = state.ops[opId];
  if (op && op.fingerprint !== fingerprint) throw invalid(`op_id ${opId} was already used for a different request`);
  return op ? op.requestId : null;
}

// ---- actions --------------------------------------------------------------------------------------------------

const actions = {
  async describeProvider() {
    return {
      name: 'node-example', version: '1.0.0', contractVersion: 1,
      features: {idempotentRequest: true, listMachines: true, stopMachines: false, tags: true, priceQuotes: false},
    };
  },

  async getAvailableTemplates() {
    return {templates: config.templates};
  },

  async requestMachines(input) {
    const {templateId, machineCount: count} = input.template || {};
    const template = config.templates.find((t) => t.templateId === templateId);
    if (!template) throw invalid(`unknown template ${JSON.stringify(templateId)}`);
    if (!Number.isInteger(count) || count < 1) throw invalid('template.machineCount must be an integer >= 1');
    const [opId, tags] = opAndTags(input);
    const boots = input.bootstrap;
    if (!Array.isArray(boots) || boots.length !== count) throw invalid(`bootstrap: expected ${count} entries`);
    if (!boots.every((b) => b && typeof b.instanceRef === 'string' && typeof b.joinToken === 'string')) {
      throw invalid('bootstrap: every entry needs an instanceRef and a joinToken');  // never echo a token
    }
    return exclusively(async () => {
      const fingerprint = JSON.stringify(['create', templateId, count]);
      const known = replay(opId, fingerprint);
      if (known) return {requestId: known, message: 'op_id already requested: same request, no new machines'};
      const live = Object.values(state.machines).filter((m) => isLive(m) && m.templateId === templateId).length;
      if (live + count > template.maxNumber) {
        throw new ProviderError('quota_exceeded', `template ${templateId}: ${live} live + ${count} > maxNumber`);
      }
      await cloudCall();
      const requestId = nextId('req');
      const machineIds = boots.map((boot) => {
        const machineId = nextId('node');
        state.machines[machineId] = {
          machineId, name: `${machineId}.example.internal`, templateId, requestId,
          privateIpAddress: `10.77.${(state.counter >> 8) & 255}.${state.counter & 255}`,
          launchtime: Math.floor(Date.now() / 1000), launchMs: Date.now(),
          instanceRef: boot.instanceRef,
          tags: {...tags, 'provisionerd:instance': boot.instanceRef},
          // The join token is a secret: we keep only its hash (a real plugin hands it to the machine's boot
          // script through the cloud's user data, and never logs it).
          joinTokenSha256: crypto.createHash('sha256').update(String(boot.joinToken)).digest('hex'),
        };
        return machineId;
      });
      state.requests[requestId] = {kind: 'create', machineIds};
      state.ops[opId] = {requestId, fingerprint};  // recorded with the machines, in one save
      save();
      return {requestId, message: `requested ${count} x ${templateId}`};
    });
  },

  async getRequestStatus(input) {
    if (!Array.isArray(input.requests)) throw invalid('requests: expected a list of {"requestId": ...}');
    await cloudCall();
    return {requests: input.requests.map(({requestId}) => requestStatus(requestId))};
  },

  async requestReturnMachines(input) {
    if (!Array.isArray(input.machines) || input.machines.length === 0) throw invalid('machines: expected a list');
    const [opId, tags] = opAndTags(input);
    return exclusively(async () => {
      const fingerprint = JSON.stringify(['return', input.machines.map((m) => m.machineId).sort()]);
      const known = replay(opId, fingerprint);
      if (known) return {requestId: known, message: 'op_id already requested: same return request'};
      await cloudCall();
      const requestId = nextId('ret');
      const entries = input.machines.map(({machineId, name}) => {
        const m = state.machines[machineId];
        if (!m) return {machineId, name, refused: '', unknown: true};
        // Never touch what is not provably the caller's.
        if (m.tags['provisionerd:cluster'] !== tags['provisionerd:cluster']) {
          return {machineId, name, refused: 'not returned: it belongs to another cluster'};
        }
        if (isLive(m)) m.returnedBy = requestId;  // returning twice is harmless: the first return stands
        return {machineId, name, refused: ''};
      });
      state.requests[requestId] = {kind: 'return', entries};
      state.ops[opId] = {requestId, fingerprint};
      save();
      return {requestId, message: `returning ${entries.length} machine(s)`};
    });
  },

  async getReturnRequests(input) {
    paging(input);  // nobody reclaims our machines: one empty page, whatever the cursor
    return {status: 'complete', message: '', requests: []};
  },

  async listMachines(input) {
    const filter = input.tags;
    if (!filter || typeof filter !== 'object' || typeof filter['provisionerd:cluster'] !== 'string') {
      throw invalid('tags: a filter naming provisionerd:cluster is required');
    }
    const {cursor, pageSize} = paging(input);
    await cloudCall();
    // Keyset paging (docs/providers.md, "Paging"): machineId order, the page after the cursor, and the page's
    // last id as nextCursor when more follow.
    const matching = Object.values(state.machines)
      .filter((m) => isLive(m) && Object.entries(filter).every(([k, v]) => m.tags[k] === v))
      .filter((m) => cursor === undefined || m.machineId > cursor)
      .sort((a, b) => (a.machineId < b.machineId ? -1 : a.machineId > b.machineId ? 1 : 0));
    const page = pageSize === undefined ? matching : matching.slice(0, pageSize);
    const machines = page.map((m) => ({
      machineId: m.machineId, name: m.name, status: machineStatus(m), launchtime: m.launchtime,
      privateIpAddress: m.privateIpAddress, tags: m.tags,
    }));
    if (page.length < matching.length) return {machines, nextCursor: page[page.length - 1].machineId};
    return {machines};
  },
};

// The optional paging fields of listMachines and getReturnRequests.
function paging(input) {
  const {cursor, pageSize} = input;
  if (cursor !== undefined && (typeof cursor !== 'string' || cursor === '')) {
    throw invalid('cursor: expected a non-empty string');
  }
  if (pageSize !== undefined && !(Number.isInteger(pageSize) && pageSize >= 1)) {
    throw invalid('pageSize: expected an integer >= 1');
  }
  return {cursor, pageSize};
}

function machineDoc(m, result, status, message = '') {
  return {
    machineId: m.machineId, name: m.name, result, status, privateIpAddress: m.privateIpAddress,
    launchtime: m.launchtime, message, instanceRef: m.instanceRef, tags: m.tags,
  };
}

function requestStatus(requestId) {
  const req = state.requests[requestId];
  if (!req) return {requestId, status: 'complete_with_error', message: 'unknown request', machines: []};
  let machines;
  if (req.kind === 'create') {
    machines = req.machineIds.map((id) => {
      const m = state.machines[id];
      const status = machineStatus(m);
      return machineDoc(m, status === 'pending' ? 'executing' : 'succeed', status);
    });
  } else {
    machines = req.entries.map((e) => {
      const m = state.machines[e.machineId];
      if (e.unknown) {
        return {machineId: e.machineId, name: e.name, result: 'succeed', status: 'terminated',
                message: 'no such machine: nothing to return'};
      }
      return e.refused ? machineDoc(m, 'fail', machineStatus(m), e.refused) : machineDoc(m, 'succeed', 'terminated');
    });
  }
  const results = new Set(machines.map((m) => m.result));
  const status = results.has('executing') ? 'running' : results.has('fail') ? 'complete_with_error' : 'complete';
  return {requestId, status, message: '', machines};
}

// ---- the JSON-lines loop --------------------------------------------------------------------------------------

const send = (doc) => process.stdout.write(JSON.stringify(doc) + '\n');
const inFlight = new Set();

async function handle(line) {
  let msg;
  try {
    msg = JSON.parse(line);
  } catch {
    console.error(`node-example: ignoring a line that is not JSON (${line.length} bytes)`);
    return;
  }
  if (!msg || !Number.isInteger(msg.id)) {
    console.error('node-example: ignoring a request without an integer id');
    return;
  }
  const action = actions[msg.action];
  try {
    if (!action) throw invalid(`unknown action ${JSON.stringify(msg.action)}`);
    const input = msg.input && typeof msg.input === 'object' ? msg.input : {};
    send({id: msg.id, result: await action(input)});
  } catch (err) {
    const error = err instanceof ProviderError ? err : new ProviderError('provider_error', String(err.message || err));
    send({id: msg.id, error: error.document()});
  }
}

const lines = readline.createInterface({input: process.stdin, crlfDelay: Infinity});
lines.on('line', (line) => {
  if (!line.trim()) return;
  const task = handle(line);
  inFlight.add(task);
  task.finally(() => inFlight.delete(task));
});
lines.on('close', async () => {
  await Promise.allSettled([...inFlight]);
  process.exit(0);
});
