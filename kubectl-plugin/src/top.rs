//! `kubectl tessera top`: a node-per-line summary of the GPUs and the queue tree, redrawn every
//! few seconds until q, Esc or ctrl-c (`--once`: one frame, for scripts and tests). On a
//! terminal it draws on the alternate screen and restores the terminal however it ends;
//! otherwise it prints a frame per interval until interrupted.

use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use crossterm::{cursor, execute, terminal};
use tessera_contract::crd::{GpuNode, Queue};

use crate::format::{columns, gib};
use crate::{client, gpus, queues};

/// One frame from the views and queues.
pub(crate) fn frame(nodes: &[GpuNode], queue_list: &[Queue], header: &str) -> String {
    let mut out = format!("{header}\n\n");
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let name = n.metadata.name.clone().unwrap_or_default();
            let Some(s) = &n.status else {
                return vec![
                    name,
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "not reported".into(),
                ];
            };
            let used: u64 = s.gpus.iter().map(|g| g.used_memory_mib).sum();
            let total: u64 = s.gpus.iter().map(|g| g.memory_mib).sum();
            let util = if s.gpus.is_empty() {
                0
            } else {
                s.gpus
                    .iter()
                    .map(|g| u64::from(g.utilization_percent))
                    .sum::<u64>()
                    / s.gpus.len() as u64
            };
            let mut pods: Vec<(&str, &str)> = s
                .gpus
                .iter()
                .flat_map(|g| g.shares.iter())
                .map(|sh| (sh.namespace.as_str(), sh.pod.as_str()))
                .collect();
            pods.sort_unstable();
            pods.dedup();
            vec![
                name,
                s.model.clone(),
                s.gpu_count.to_string(),
                s.healthy_gpus.to_string(),
                s.free_gpus.to_string(),
                format!("{util}%"),
                format!("{}/{}", gib(used), gib(total)),
                pods.len().to_string(),
                if s.agent.connected {
                    "connected"
                } else {
                    "not connected"
                }
                .into(),
            ]
        })
        .collect();
    out.push_str(&columns(
        &[
            "NODE", "MODEL", "GPUS", "HEALTHY", "FREE", "UTIL", "MEMORY", "PODS", "AGENT",
        ],
        &rows,
    ));
    out.push_str(&gpus::summary(nodes));
    out.push('\n');
    out.push_str(&queues::table(queue_list));
    out
}

async fn read(client: &kube::Client, header: &str) -> anyhow::Result<String> {
    let nodes = gpus::fetch(client).await?;
    let queue_list = queues::fetch(client).await?;
    Ok(frame(&nodes, &queue_list, header))
}

fn header(interval: Duration, keys: bool) -> String {
    let now = jiff::Zoned::now()
        .strftime("%Y-%m-%d %H:%M:%S %Z")
        .to_string();
    if keys {
        format!(
            "kubectl tessera top — {now} — every {}s; q to quit",
            interval.as_secs()
        )
    } else {
        format!("kubectl tessera top — {now}")
    }
}

/// Runs until q or ctrl-c (`once`: one frame).
pub(crate) async fn run(
    client: &kube::Client,
    interval: Duration,
    once: bool,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    if once {
        out.write_all(read(client, &header(interval, false)).await?.as_bytes())?;
        return Ok(());
    }
    if !(out.is_terminal() && std::io::stdin().is_terminal()) {
        loop {
            let text = match read(client, &header(interval, false)).await {
                Ok(t) => t,
                Err(e) => client::explain(&e),
            };
            out.write_all(format!("{text}\n").as_bytes())?;
            out.flush()?;
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    }
    let _screen = Screen::enter()?;
    let (keys_tx, mut keys) = tokio::sync::mpsc::unbounded_channel();
    // crossterm's reads block: a thread of their own, ended with the process.
    std::thread::spawn(move || {
        while let Ok(event) = crossterm::event::read() {
            if keys_tx.send(event).is_err() {
                break;
            }
        }
    });
    loop {
        let text = match read(client, &header(interval, true)).await {
            Ok(t) => t,
            Err(e) => client::explain(&e),
        };
        execute!(
            out,
            cursor::MoveTo(0, 0),
            terminal::Clear(terminal::ClearType::All)
        )?;
        // Raw mode: a line feed does not return the carriage.
        out.write_all(text.replace('\n', "\r\n").as_bytes())?;
        out.flush()?;
        let deadline = tokio::time::sleep(interval);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                event = keys.recv() => match event {
                    None => return Ok(()),
                    Some(e) if quits(&e) => return Ok(()),
                    Some(Event::Resize(..)) => break,
                    Some(_) => {}
                },
            }
        }
    }
}

fn quits(event: &Event) -> bool {
    matches!(
        event,
        Event::Key(KeyEvent {
            code: KeyCode::Char('q') | KeyCode::Esc,
            ..
        })
    ) || matches!(
        event,
        Event::Key(KeyEvent { code: KeyCode::Char('c'), modifiers, .. }) if modifiers.contains(KeyModifiers::CONTROL)
    )
}

/// Raw mode on the alternate screen, cursor hidden, until dropped.
struct Screen;

impl Screen {
    fn enter() -> anyhow::Result<Screen> {
        terminal::enable_raw_mode()?;
        let screen = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpus::tests::{gpu, node, share};
    use crate::queues::tests::queue;

    #[test]
    fn a_frame_has_a_line_per_node_and_the_queue_tree() {
        let nodes = vec![
            node(
                "a",
                true,
                vec![gpu(0, vec![share("x", 25, 11517)]), gpu(1, vec![])],
            ),
            node("b", false, vec![gpu(0, vec![])]),
        ];
        let queues = vec![queue("default", None, 0.0, Some((1.0, 0.25, 0.25)))];
        let text = frame(&nodes, &queues, "top");
        let want = "\
top

NODE  MODEL  GPUS  HEALTHY  FREE  UTIL  MEMORY        PODS  AGENT
a     L40S   2     2        1     5%    1.0Gi/90.0Gi  1     connected
b     L40S   1     1        1     0%    0.0Gi/45.0Gi  0     not connected
2 nodes, 3 GPUs: 3 healthy, 2 free (no share held); 1 pods hold shares.

QUEUE    DESERVED  FAIR SHARE  ALLOCATED  PENDING  LIMIT  WEIGHT  PRIORITY
default  0         1           0.25       0        -      1       0
GPUs. Allocated and pending count a queue's whole subtree; - = not reported yet.
";
        assert_eq!(text, want);
    }

    #[test]
    fn q_esc_and_ctrl_c_quit() {
        let key = |code, modifiers| Event::Key(KeyEvent::new(code, modifiers));
        assert!(quits(&key(KeyCode::Char('q'), KeyModifiers::NONE)));
        assert!(quits(&key(KeyCode::Esc, KeyModifiers::NONE)));
        assert!(quits(&key(KeyCode::Char('c'), KeyModifiers::CONTROL)));
        assert!(!quits(&key(KeyCode::Char('c'), KeyModifiers::NONE)));
        assert!(!quits(&Event::Resize(80, 24)));
    }
}
