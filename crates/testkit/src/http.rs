//! The HTTP calls every suite makes: POST a completion, GET a page as JSON, text or bytes. Each
//! checks the status it expects and names the URL when it fails, so a test states only the request
//! and what it asserts about the answer.

use reqwest::{Client, Response, StatusCode};
use serde_json::Value;

/// POST `body` as JSON to `url`; the response, whatever its status.
pub async fn post(c: &Client, url: &str, body: &Value) -> Response {
    c.post(url)
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

/// POST `body` to `{base_url}/v1/completions`; the response, whatever its status.
pub async fn complete(c: &Client, base_url: &str, body: &Value) -> Response {
    post(c, &format!("{base_url}/v1/completions"), body).await
}

/// [`complete`], asserting a 200; the response, for its headers and body.
pub async fn complete_ok(c: &Client, base_url: &str, body: &Value) -> Response {
    let resp = complete(c, base_url, body).await;
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "POST {base_url}/v1/completions {body}"
    );
    resp
}

/// The body of a 200 answer to `resp` (sent to `what`) as text; panics naming `what` otherwise.
async fn ok_text(resp: Response, what: &str) -> String {
    let status = resp.status();
    let text = resp
        .text()
        .await
        .unwrap_or_else(|e| panic!("{what}: reading the body: {e}"));
    assert_eq!(status, StatusCode::OK, "{what}: {text}");
    text
}

/// POST `body` as JSON to `url`, asserting a 200; the answer's JSON.
pub async fn post_json(c: &Client, url: &str, body: &Value) -> Value {
    let text = ok_text(post(c, url, body).await, &format!("POST {url}")).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {url}: not JSON ({e}): {text}"))
}

/// `GET url`, asserting a 200; the body as text.
pub async fn get_text(c: &Client, url: &str) -> String {
    let resp = c
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    ok_text(resp, &format!("GET {url}")).await
}

/// `GET url`, asserting a 200; the body as JSON.
pub async fn get_json(c: &Client, url: &str) -> Value {
    let text = get_text(c, url).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {text}"))
}
