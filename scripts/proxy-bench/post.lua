wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"hello","max_tokens":4}'
wrk.headers["Content-Type"] = "application/json"
