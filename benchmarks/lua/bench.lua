-- wrk script of qag's benchmark harness (benchmarks/run.py writes the config, starts wrk, reads the JSON line).
--
--   wrk -s benchmarks/lua/bench.lua URL -- <config.lua> [rate per thread]
--   QAG_BENCH_WRK_MODE=closed|open (environment; open defines delay(), which wrk only looks for once at load)
--
-- Every request carries an X-Request-Id that the gateway echoes (contract 0.4), so each reply is matched to
-- its request: non-2xx replies are counted, and a 2xx reply must begin with the key-space values that were
-- asked for (`[{"c_w_id":2,"c_d_id":7,"c_id":1234,`) -- a reply for another user, an error envelope or an
-- empty result fails the check.
--
-- Open loop: each thread keeps a schedule at its share of the offered rate; delay() hands every ready
-- connection the next slot, and latency is measured from that intended send time (or the actual one when
-- wrk's millisecond timer fired early), so waiting behind a slow server is counted: corrected for
-- coordinated omission, as wrk2 does per connection.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } qag_timespec_t;
int clock_gettime(int clk_id, qag_timespec_t *tp);
]]
local ts = ffi.new("qag_timespec_t")
local function now_us()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

local MODE = os.getenv("QAG_BENCH_WRK_MODE") or "closed"
local threads = {}
local thread_count = 0

function setup(thread)
  thread_count = thread_count + 1
  thread:set("tid", thread_count)
  table.insert(threads, thread)
end

local cfg, reqs, dims, N, H, cdf, zipf
local seq = 0
local pending = {}
local slots, slot_head, slot_tail = {}, 1, 0
local next_slot, interval = nil, 0
local hdrs

function init(args)
  cfg = dofile(args[1])
  local rate = tonumber(args[2] or "0") or 0
  interval = rate > 0 and 1e6 / rate or 0
  math.randomseed(7919 * (tid or 1) + 17)
  reqs, dims, N = cfg.requests, cfg.dims, cfg.size
  zipf = cfg.distribution == "zipf"
  if zipf then
    cdf = {}
    local h = 0
    for k = 1, N do
      h = h + 1 / k
      cdf[k] = h
    end
    H = h
  end
  hdrs = {}
  if cfg.key ~= "" then hdrs["X-API-Key"] = cfg.key end
  -- counters read by done() through thread:get
  responses, non2xx, checked, bad, unmatched = 0, 0, 0, 0, 0
  bad_sample, status_sample = "", ""
  lat, nlat = {}, 0
end

local function draw()
  local rank
  if zipf then
    local x = math.random() * H
    local lo, hi = 1, N
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if cdf[mid] < x then lo = mid + 1 else hi = mid end
    end
    rank = lo - 1
  else
    rank = math.floor(math.random() * N)
  end
  local user = (rank * cfg.stride + cfg.offset) % N
  local vals = {}
  for i = #dims, 1, -1 do
    local size = dims[i][2]
    vals[dims[i][1]] = user % size + 1
    user = math.floor(user / size)
  end
  return vals
end

if MODE == "open" then
  function delay()
    local t = now_us()
    if not next_slot then next_slot = t end
    local slot = next_slot
    next_slot = next_slot + interval
    slot_tail = slot_tail + 1
    slots[slot_tail] = slot
    local d = (slot - t) / 1000
    if d < 1 then return 0 end
    return math.floor(d)
  end
end

function request()
  seq = seq + 1
  local id = "b" .. tid .. "-" .. seq
  local r = reqs[math.random(#reqs)]
  local vals = draw()
  local path = (r.path:gsub("{([%w_]+)}", vals))
  local start = now_us()
  if MODE == "open" and slot_head <= slot_tail then
    local intended = slots[slot_head]
    slots[slot_head] = nil
    slot_head = slot_head + 1
    if intended < start then start = intended end
  end
  local check = nil
  if r.check ~= "" then check = (r.check:gsub("{([%w_]+)}", vals)) end
  pending[id] = { check, start }
  hdrs["X-Request-Id"] = id
  return wrk.format("GET", path, hdrs)
end

function response(status, headers, body)
  responses = responses + 1
  local id = headers["X-Request-Id"] or headers["x-request-id"]
  local p = id and pending[id]
  if p then pending[id] = nil end
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
    if status_sample == "" then status_sample = status .. " " .. string.sub(body or "", 1, 300) end
    return
  end
  if not p then
    unmatched = unmatched + 1
    return
  end
  if MODE == "open" then
    nlat = nlat + 1
    lat[nlat] = now_us() - p[2]
  end
  if p[1] then
    checked = checked + 1
    if not string.find(body, p[1], 1, true) then
      bad = bad + 1
      if bad_sample == "" then bad_sample = "expected " .. p[1] .. " got " .. string.sub(body, 1, 300) end
    end
  end
end

local function jstr(s)
  s = tostring(s or "")
  s = s:gsub('[%c"\\]', function(c) return string.format("\\u%04x", string.byte(c)) end)
  return '"' .. s .. '"'
end

function done(summary, latency, requests)
  local agg = { responses = 0, non2xx = 0, checked = 0, bad = 0, unmatched = 0 }
  local all, n = {}, 0
  local bad_s, status_s = "", ""
  for _, t in ipairs(threads) do
    for k, _ in pairs(agg) do agg[k] = agg[k] + (t:get(k) or 0) end
    if bad_s == "" then bad_s = t:get("bad_sample") or "" end
    if status_s == "" then status_s = t:get("status_sample") or "" end
    if MODE == "open" then
      local l = t:get("lat") or {}
      for i = 1, #l do n = n + 1; all[n] = l[i] end
    end
  end
  local e = summary.errors
  local out = {
    string.format('"mode":%s,"duration_us":%d,"requests":%d,"bytes":%d', jstr(MODE), summary.duration,
      summary.requests, summary.bytes),
    string.format('"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}', e.connect, e.read,
      e.write, e.status, e.timeout),
    string.format('"responses":%d,"non2xx":%d,"checked":%d,"bad":%d,"unmatched":%d', agg.responses, agg.non2xx,
      agg.checked, agg.bad, agg.unmatched),
    string.format('"bad_sample":%s,"status_sample":%s', jstr(bad_s), jstr(status_s)),
    string.format('"lat_us":{"mean":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d}', latency.mean, latency.max,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9)),
  }
  if MODE == "open" then
    table.sort(all)
    local function pct(p)
      if n == 0 then return 0 end
      local i = math.max(1, math.min(n, math.ceil(p / 100 * n)))
      return all[i]
    end
    table.insert(out, string.format('"co_lat_us":{"n":%d,"p50":%.0f,"p90":%.0f,"p99":%.0f,"p999":%.0f,"max":%.0f}',
      n, pct(50), pct(90), pct(99), pct(99.9), n > 0 and all[n] or 0))
  end
  io.write("QAGJSON {" .. table.concat(out, ",") .. "}\n")
end
