import PostgresNIO
import Skyros

/// Sync with PostgreSQL (docs/SYNC.md).
package enum SkyrosSync {}
