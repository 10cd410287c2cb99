import Foundation
import PostgresNIO

/// The PostgreSQL this package's tests, replicas and benchmarks share, read from the environment
/// (not a product: the one place that reads these settings):
/// `RESILIENCE_POSTGRES_URL` (`postgres://user[:password]@host:port/database`), else
/// `RESILIENCE_POSTGRES_HOST`, `_PORT`, `_USER`, `_PASSWORD`, `_DATABASE`, each defaulting to what
/// `Scripts/postgres.sh start` runs (127.0.0.1:25432, database `resilience_test`, user `postgres`
/// as root, else the caller). A URL's parts win over the separate variables.
package enum PostgresEnvironment {
    /// The client configuration for that server: no TLS, a 5 s connect timeout.
    package static let configuration: PostgresClient.Configuration = {
        let environment = ProcessInfo.processInfo.environment
        var host = environment["RESILIENCE_POSTGRES_HOST"] ?? "127.0.0.1"
        var port = environment["RESILIENCE_POSTGRES_PORT"].flatMap(Int.init) ?? 25432
        var user = environment["RESILIENCE_POSTGRES_USER"] ?? (getuid() == 0 ? "postgres" : ProcessInfo.processInfo.userName)
        var password = environment["RESILIENCE_POSTGRES_PASSWORD"]
        var database = environment["RESILIENCE_POSTGRES_DATABASE"] ?? "resilience_test"
        if let url = environment["RESILIENCE_POSTGRES_URL"].flatMap(URLComponents.init(string:)) {
            host = url.host ?? host
            port = url.port ?? port
            user = url.user ?? user
            password = url.password ?? password
            let path = url.path.drop { $0 == "/" }
            if !path.isEmpty { database = String(path) }
        }
        var configuration = PostgresClient.Configuration(host: host, port: port, username: user, password: password, database: database, tls: .disable)
        configuration.options.connectTimeout = .seconds(5)
        return configuration
    }()
}
