//! The published figure metrics: allocation (and fragmentation) versus arrived workload, averaged
//! per integer percent exactly as the FGD artifact's analysis scripts do.

use super::fill::EventPoint;

/// One point of a curve: integer percent of GPU capacity arrived, and the averaged value.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CurvePoint {
    /// Arrived GPU request in percent of cluster GPU capacity.
    pub arrived_pct: u32,
    /// Averaged value (percent), rounded to 2 decimals.
    pub alloc_pct: f64,
}

/// Python's `round(x)` on a float: nearest integer, ties to even.
pub fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

/// Python's `round(x, 2)` (ties to even on the scaled value).
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round_ties_even() / 100.0
}

/// Averages `value(event)` per integer arrived percent `0..=max_pct`: the mean over events whose
/// rounded arrived percent equals x; if none, the mean over events within x±1; x is skipped if
/// that is empty too.
pub fn curve_of<F>(
    events: &[EventPoint],
    total_gpus: u64,
    max_pct: u32,
    value: F,
) -> Vec<CurvePoint>
where
    F: Fn(&EventPoint) -> f64,
{
    if total_gpus == 0 {
        return Vec::new();
    }
    let denom = 10.0 * total_gpus as f64;
    let slots = max_pct as usize + 2;
    let mut sum = vec![0.0f64; slots];
    let mut cnt = vec![0u64; slots];
    for e in events {
        let pct = round_half_even(e.arrived_milli as f64 / denom);
        if pct >= 0.0 && (pct as usize) < slots {
            sum[pct as usize] += value(e);
            cnt[pct as usize] += 1;
        }
    }
    let mut out = Vec::new();
    for x in 0..=max_pct as usize {
        let (s, c) = if cnt[x] > 0 {
            (sum[x], cnt[x])
        } else {
            let lo = x.saturating_sub(1);
            let hi = (x + 1).min(slots - 1);
            (
                (lo..=hi).map(|i| sum[i]).sum(),
                (lo..=hi).map(|i| cnt[i]).sum(),
            )
        };
        if c > 0 {
            out.push(CurvePoint {
                arrived_pct: x as u32,
                alloc_pct: round2(s / c as f64),
            });
        }
    }
    out
}

/// The allocation curve: GPU milli allocated in percent of capacity, versus arrived percent.
pub fn alloc_curve(events: &[EventPoint], total_gpus: u64, max_pct: u32) -> Vec<CurvePoint> {
    let denom = 10.0 * total_gpus as f64;
    curve_of(events, total_gpus, max_pct, |e| e.used_milli as f64 / denom)
}

/// The fragmentation curve: fragment in percent of cluster GPU capacity.
pub fn frag_curve(events: &[EventPoint], total_gpus: u64, max_pct: u32) -> Vec<CurvePoint> {
    let denom = 10.0 * total_gpus as f64;
    curve_of(events, total_gpus, max_pct, |e| e.frag_milli / denom)
}

/// The curve's value at `x` percent arrived, if present.
pub fn at(curve: &[CurvePoint], x: u32) -> Option<f64> {
    curve
        .iter()
        .find(|p| p.arrived_pct == x)
        .map(|p| p.alloc_pct)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(arrived: u64, used: u64) -> EventPoint {
        EventPoint {
            arrived_milli: arrived,
            used_milli: used,
            frag_milli: 0.0,
        }
    }

    #[test]
    fn python_rounding() {
        assert_eq!(round_half_even(0.5), 0.0);
        assert_eq!(round_half_even(1.5), 2.0);
        assert_eq!(round_half_even(2.5), 2.0);
        assert_eq!(round_half_even(2.51), 3.0);
        assert_eq!(round2(1.234), 1.23);
    }

    #[test]
    fn averages_per_percent_with_neighbour_fallback() {
        // 1 GPU -> 1% = 10 milli. Events at 0%, 1%, 1%, 3% arrived.
        let events = [ev(0, 0), ev(10, 10), ev(14, 14), ev(30, 20)];
        let c = alloc_curve(&events, 1, 4);
        // x=0: 0; x=1: mean(1.0, 1.4) = 1.2; x=2: none -> 1..=3 -> mean(1.0,1.4,2.0)=1.47;
        // x=3: 2.0; x=4: none -> 3..=5 -> 2.0.
        let want = [(0, 0.0), (1, 1.2), (2, 1.47), (3, 2.0), (4, 2.0)];
        assert_eq!(c.len(), want.len());
        for (p, (x, v)) in c.iter().zip(want) {
            assert_eq!(p.arrived_pct, x);
            assert!((p.alloc_pct - v).abs() < 1e-9, "{p:?}");
        }
        // 25 milli = 2.5% rounds to 2 (half to even).
        let c = alloc_curve(&[ev(25, 5)], 1, 3);
        assert_eq!(c[0].arrived_pct, 1, "x=1 falls back to the neighbour at 2");
        assert_eq!(at(&c, 2), Some(0.5));
        assert_eq!(at(&c, 0), None);
    }
}
