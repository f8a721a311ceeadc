import PostgresNIO
import Skyros

/// Sync with PostgreSQL (DESIGN §9).
package enum SkyrosSync {}
