wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":64,"ignore_eos":true}'
