//! Stores named by one string, `<backend>:<location>`: how `migrate`, a
//! storage move and the data dir's backend choice name a store.

use std::path::{Path, PathBuf};

use crate::{StorageConfig, StorageType, SurrealdbConfig};

impl StorageConfig {
    /// Reads `<backend>:<location>`. `surrealdb` gives what the spec does
    /// not: credentials, engine, timeouts, and the namespace and database
    /// when a server spec leaves them out. The error names what is wrong.
    pub fn from_spec(spec: &str, surrealdb: SurrealdbConfig) -> Result<StorageConfig, String> {
        let Some((backend, location)) = spec.split_once(':') else {
            return Err(format!(
                "`{spec}`: expected <backend>:<location>, e.g. filesystem:./data, \
                 surrealdb-embedded:./data or surrealdb-server:ws://127.0.0.1:8000/orchestrator/orchestrator"
            ));
        };
        let storage_type: StorageType = backend.parse().map_err(|e| format!("`{spec}`: {e}"))?;
        if location.is_empty() {
            return Err(format!(
                "`{spec}`: the location after `{backend}:` is empty"
            ));
        }
        let mut config = StorageConfig {
            storage_type,
            data_dir: PathBuf::from(location),
            surrealdb,
        };
        if storage_type == StorageType::SurrealdbServer {
            let (scheme, rest) = location
                .split_once("://")
                .ok_or_else(|| format!("`{spec}`: expected ws://host:port[/namespace/database]"))?;
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            if authority.contains('@') {
                return Err(format!(
                    "{backend}: credentials do not belong in a spec, which is printed and logged; \
                     use --from-password / --to-password or their ORCHESTRATOR_MIGRATE_* variables"
                ));
            }
            config.surrealdb.url = format!("{scheme}://{authority}");
            let names: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
            match names.as_slice() {
                [] => {}
                [namespace, database] => {
                    config.surrealdb.namespace = (*namespace).to_owned();
                    config.surrealdb.database = (*database).to_owned();
                }
                _ => {
                    return Err(format!(
                        "`{spec}`: the path names the namespace and the database, as /<namespace>/<database>"
                    ));
                }
            }
            config.data_dir = PathBuf::new();
        }
        Ok(config)
    }

    /// The store as a spec that [`StorageConfig::from_spec`] reads back:
    /// a directory made absolute, a server with its namespace and
    /// database. Never credentials.
    pub fn spec(&self) -> String {
        match self.storage_type {
            StorageType::SurrealdbServer => format!(
                "{}:{}/{}/{}",
                self.storage_type,
                self.surrealdb.url,
                self.surrealdb.namespace,
                self.surrealdb.database
            ),
            other => format!("{other}:{}", absolute(&self.data_dir).display()),
        }
    }

    /// Whether two configs name one store, however spelled (`./data` and
    /// `data`; a server's URL, namespace and database).
    pub fn same_store(&self, other: &StorageConfig) -> bool {
        if self.storage_type != other.storage_type {
            return false;
        }
        match self.storage_type {
            StorageType::SurrealdbServer => {
                (
                    &self.surrealdb.url,
                    &self.surrealdb.namespace,
                    &self.surrealdb.database,
                ) == (
                    &other.surrealdb.url,
                    &other.surrealdb.namespace,
                    &other.surrealdb.database,
                )
            }
            _ => absolute(&self.data_dir) == absolute(&other.data_dir),
        }
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StorageType, SurrealdbConfig};
    use std::path::PathBuf;

    fn parse(spec: &str) -> Result<StorageConfig, String> {
        StorageConfig::from_spec(spec, SurrealdbConfig::default())
    }

    #[test]
    fn specs_name_backend_and_location() {
        let fs = parse("filesystem:./data").unwrap();
        assert_eq!(fs.storage_type, StorageType::Filesystem);
        assert_eq!(fs.data_dir, PathBuf::from("./data"));
        let embedded = parse("surrealdb-embedded:/var/lib/o").unwrap();
        assert_eq!(embedded.storage_type, StorageType::SurrealdbEmbedded);
        assert_eq!(embedded.data_dir, PathBuf::from("/var/lib/o"));
        let server = parse("surrealdb-server:ws://db:8000/ops/prod").unwrap();
        assert_eq!(server.storage_type, StorageType::SurrealdbServer);
        assert_eq!(server.surrealdb.url, "ws://db:8000");
        assert_eq!(server.surrealdb.namespace, "ops");
        assert_eq!(server.surrealdb.database, "prod");
        let bare = parse("surrealdb-server:wss://db:8000").unwrap();
        assert_eq!(bare.surrealdb.url, "wss://db:8000");
        assert_eq!(bare.surrealdb.namespace, "orchestrator");
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let message = |spec: &str| parse(spec).unwrap_err();
        assert!(message("./data").contains("expected <backend>:<location>"));
        assert!(message("postgres:./x").contains("unknown storage type `postgres`"));
        assert!(message("filesystem:").contains("location after `filesystem:` is empty"));
        assert!(
            message("surrealdb-server:ws://root:secret@db:8000")
                .contains("credentials do not belong")
        );
        assert!(!message("surrealdb-server:ws://root:secret@db:8000").contains("secret@"));
        assert!(
            message("surrealdb-server:ws://db:8000/onlyns").contains("/<namespace>/<database>")
        );
    }

    #[test]
    fn the_same_store_twice_is_noticed() {
        let a = parse("filesystem:./data").unwrap();
        let b = parse("filesystem:data").unwrap();
        assert!(a.same_store(&b));
        let c = parse("surrealdb-embedded:./data").unwrap();
        assert!(!a.same_store(&c));
        assert_eq!(
            StorageConfig::from_spec(&a.spec(), SurrealdbConfig::default())
                .unwrap()
                .data_dir,
            std::path::absolute("data").unwrap()
        );
        let server = parse("surrealdb-server:ws://db:8000").unwrap();
        assert_eq!(
            server.spec(),
            "surrealdb-server:ws://db:8000/orchestrator/orchestrator"
        );
    }
}
