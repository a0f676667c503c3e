-- The request mix of benchmarks/soak.py. Args: IDS_FILE LISTS_FILE TOKEN.
local ids, lists = {}, {}
function init(args)
  for line in io.lines(args[1]) do ids[#ids + 1] = line end
  for line in io.lines(args[2]) do lists[#lists + 1] = line end
  wrk.headers["Authorization"] = "Bearer " .. args[3]
  math.randomseed(os.time() * 1000 + math.floor(os.clock() * 1000000))
end
function request()
  if math.random() < 0.5 then
    return wrk.format("GET", "/v1/applicants/" .. ids[math.random(#ids)])
  end
  return wrk.format("GET", lists[math.random(#lists)])
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'SOAK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"non_2xx_3xx":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,' ..
    '"p99_us":%d,"p999_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.status, e.connect, e.read,
    e.write, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max, latency.mean))
end
