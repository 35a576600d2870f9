//! Times as people read them in messages: epoch seconds (the database clock's unit) as RFC 3339
//! in UTC, to the second. The store's own messages use it (who decided when), and so does the
//! CLI, so that a time reads the same wherever it is shown.

/// Epoch seconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC, the fraction dropped).
pub fn rfc3339_utc(epoch_seconds: f64) -> String {
    let millis = (epoch_seconds.floor() as i64).saturating_mul(1000);
    let (date, ms) = civil(millis);
    format!(
        "{date}T{:02}:{:02}:{:02}Z",
        ms / 3_600_000,
        ms % 3_600_000 / 60_000,
        ms % 60_000 / 1000
    )
}

/// Epoch seconds as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, to the millisecond, rounded).
pub fn rfc3339_utc_millis(epoch_seconds: f64) -> String {
    let (date, ms) = civil((epoch_seconds * 1000.0).round() as i64);
    format!(
        "{date}T{:02}:{:02}:{:02}.{:03}Z",
        ms / 3_600_000,
        ms % 3_600_000 / 60_000,
        ms % 60_000 / 1000,
        ms % 1000
    )
}

/// The civil date (`YYYY-MM-DD`) of epoch milliseconds `millis`, and the milliseconds into it
/// (Howard Hinnant's days-to-civil algorithm).
fn civil(millis: i64) -> (String, i64) {
    let (days, rest) = (millis.div_euclid(86_400_000), millis.rem_euclid(86_400_000));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (format!("{year:04}-{month:02}-{day:02}"), rest)
}

#[cfg(test)]
mod tests {
    use super::{rfc3339_utc, rfc3339_utc_millis};

    #[test]
    fn epoch_seconds_read_as_rfc_3339_in_utc() {
        assert_eq!(rfc3339_utc(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(1_796_003_447.5), "2026-11-30T01:50:47Z");
        assert_eq!(rfc3339_utc(951_782_400.0), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(-0.5), "1969-12-31T23:59:59Z");
        assert_eq!(
            rfc3339_utc_millis(1_796_003_447.5),
            "2026-11-30T01:50:47.500Z"
        );
        assert_eq!(rfc3339_utc_millis(-0.0005), "1969-12-31T23:59:59.999Z");
    }
}
