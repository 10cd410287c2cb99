import Foundation

/// A URL as it may appear in a log line: scheme, host, port and path only. User info (which can
/// hold a password), the query (which often holds tokens), the fragment and matrix parameters
/// (`;jsessionid=…`) are dropped, whatever their content.
enum RedactedURL {
    static func string(for url: URL, pathTemplate: PathTemplate?) -> String {
        var path = URLPathScanner.percentEncodedPath(of: url)
        if let pathTemplate {
            path = pathTemplate.template(forPath: path)
        } else if path.contains(";") {
            path = path.split(separator: "/", omittingEmptySubsequences: false)
                .map { $0.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? "" }
                .joined(separator: "/")
        }
        guard let scheme = url.scheme, let host = url.host, !host.isEmpty else {
            // A relative or host-less URL: the path is all that is safe to show.
            return path
        }
        let bracketedHost = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        let port = url.port.map { ":\($0)" } ?? ""
        return "\(scheme.lowercased())://\(bracketedHost)\(port)\(path)"
    }
}
