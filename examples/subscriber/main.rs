//! A sample webhook subscriber for gridlet: prints every delivery it receives (the subscription
//! name from `aeg-subscription-name`, the delivery count, and the JSON array of events) as one
//! line on stdout and answers 200, which completes the delivery.
//!
//! Standard library only, so it builds with plain `rustc` in seconds: `compose.yaml` runs it as
//! the `subscriber` service (`examples/subscriber/Dockerfile`), and outside a container
//! `cargo run --example subscriber` listens on `SUBSCRIBER_PORT` (default 8080).
//!
//! HTTP/1.1 with `Content-Length` bodies (what gridlet sends), keep-alive, one thread per
//! connection. A sample, not a production server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::time::Duration;

/// Largest request body accepted (gridlet's default batch cap is about 1 MB).
const MAX_BODY: usize = 4 << 20;

fn main() {
    let port = std::env::var("SUBSCRIBER_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8080);
    let listener = match TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("subscriber: cannot listen on port {port}: {e}");
            std::process::exit(1);
        }
    };
    println!("subscriber: listening on 0.0.0.0:{port}");
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            if let Err(e) = serve(stream) {
                eprintln!("subscriber: connection ended: {e}");
            }
        });
    }
}

/// One request's head: what the log line needs.
struct Head {
    method: String,
    path: String,
    subscription: String,
    delivery_count: String,
    content_length: usize,
    close: bool,
}

/// Serve requests on one connection until the client closes it.
fn serve(stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    while let Some(head) = read_head(&mut reader)? {
        if head.content_length > MAX_BODY {
            writer.write_all(
                b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )?;
            return Ok(());
        }
        let mut body = vec![0; head.content_length];
        reader.read_exact(&mut body)?;
        if head.method == "POST" {
            println!(
                "subscriber: {} {} subscription={} delivery={} {}",
                head.method,
                head.path,
                head.subscription,
                head.delivery_count,
                String::from_utf8_lossy(&body).trim()
            );
        }
        let connection = if head.close { "close" } else { "keep-alive" };
        write!(
            writer,
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: {connection}\r\n\r\n"
        )?;
        if head.close {
            return Ok(());
        }
    }
    Ok(())
}

/// Read a request line and headers; `None` when the client closed the connection first.
fn read_head(reader: &mut impl BufRead) -> std::io::Result<Option<Head>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let mut head = Head {
        method: parts.next().unwrap_or("").to_string(),
        path: parts.next().unwrap_or("").to_string(),
        subscription: "-".into(),
        delivery_count: "-".into(),
        content_length: 0,
        close: false,
    };
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let header = line.trim_end();
        if header.is_empty() {
            return Ok(Some(head));
        }
        let Some((name, value)) = header.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => head.content_length = value.parse().unwrap_or(0),
            "aeg-subscription-name" => head.subscription = value.to_string(),
            "aeg-delivery-count" => head.delivery_count = value.to_string(),
            "connection" => head.close = value.eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
}
